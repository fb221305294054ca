"""``kiln.optim``: optimizers written against the public API (SGD, Adam...; next issue)."""
