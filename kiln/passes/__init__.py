"""Graph -> Graph passes of the JIT (constant folding, CSE, DCE, fusion, memory planning): one
per file, named by verb. They arrive with the tracer; see DESIGN.md."""
