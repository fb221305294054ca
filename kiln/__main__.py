"""The ``kiln`` command line (``python -m kiln`` or the ``kiln`` script) for exported programs.

    kiln show model.kiln                       # signature (arguments, parameters, results) and graph
    kiln draw model.kiln -o graph.svg          # a picture (.svg/.png/.pdf need Graphviz; .dot is text)
    kiln to-onnx model.kiln -o model.onnx      # ONNX (the onnx extra)
    kiln run model.kiln --inputs x.npy --out out.npz
    kiln bench model.kiln                      # median call time, random inputs of the signature's shapes

A file is what ``kiln.export(fn, *args).save(path)`` writes; loading it never runs code from it.
Inputs are ``.npy`` files, one per tensor argument in order, or one ``.npz`` whose arrays are taken
in the order they were saved; their shapes and dtypes must be those of the exported example.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from .frontend.jit.explain import format_bytes, kernel_line, result_words, signature_labels
from .frontend.tensor import Tensor, make_tensor
from .ir.dtypes import BY_NAME


class CommandError(Exception):
    """A mistake in the command's arguments or files: printed as ``kiln: error: ...``, exit status 2."""


# ---------------------------------------------------------------------- loading
def load(path: str):
    from .frontend.jit.export import ExportError, load_exported  # noqa: PLC0415

    if not Path(path).exists():
        raise CommandError(f"{path}: no such file (expected a file written by kiln.export(...).save(path))")
    try:
        return load_exported(path)
    except (ExportError, OSError, ValueError) as error:
        raise CommandError(f"{path}: cannot be read as an exported kiln program: {error}") from None


def tensor_specs(program) -> list[tuple[int, tuple, str]]:
    """``(argument position, shape, dtype short name)`` of each tensor argument, in order."""
    return [(i, tuple(spec[1]), spec[2]) for i, spec in enumerate(program.in_specs) if spec[0] == "tensor"]


def read_inputs(program, paths: list[str]) -> list[np.ndarray]:
    """The arrays of ``paths`` (``.npy`` files, or one ``.npz``), checked against the signature."""
    specs = tensor_specs(program)
    arrays: list[np.ndarray] = []
    for path in paths:
        if not Path(path).exists():
            raise CommandError(f"input {path}: no such file")
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise CommandError(f"input {path}: not a .npy or .npz file ({error})") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays.extend(loaded[name] for name in loaded.files)
        else:
            arrays.append(loaded)
    if len(arrays) != len(specs):
        expected = ", ".join(f"{dtype}{list(shape)}" for _, shape, dtype in specs) or "none"
        raise CommandError(f"the program takes {len(specs)} tensor input(s) ({expected}); {len(arrays)} given "
                           "(pass one .npy file per tensor argument with --inputs, or one .npz)")  # fmt: skip
    for k, (array, (position, shape, dtype)) in enumerate(zip(arrays, specs, strict=True)):
        given = f"{array.dtype} of shape {list(array.shape)}"
        if tuple(array.shape) != shape:
            raise CommandError(f"input {k} (argument {position}): expected shape {list(shape)} ({dtype}), got {given}")
        if array.dtype != BY_NAME[dtype].np:
            raise CommandError(f"input {k} (argument {position}): expected dtype {BY_NAME[dtype].np} ({dtype}), "
                               f"got {given}; convert it with array.astype(...)")  # fmt: skip
    return [np.ascontiguousarray(a) for a in arrays]


def random_inputs(program, seed: int = 0) -> list[np.ndarray]:
    """Inputs of the signature's shapes and dtypes: standard normal floats, zeros for integers (so
    indices stay in range), random bools."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _, shape, dtype in tensor_specs(program):
        np_dtype = BY_NAME[dtype].np
        if np.issubdtype(np_dtype, np.floating):
            arrays.append(rng.standard_normal(shape).astype(np_dtype))
        elif np_dtype == np.bool_:
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(np.zeros(shape, np_dtype))
    return arrays


def runner(program, compiled: bool):
    """A callable taking the tensor arguments' arrays and returning the flattened results: the
    program on the interpreter, or compiled once (the compile driver's default pipeline)."""
    from .frontend.jit.signature import apply, bind  # noqa: PLC0415

    run = program._interpreted
    if compiled:
        from .compiler.driver import compile_graph  # noqa: PLC0415
        from .compiler.options import CompileOptions  # noqa: PLC0415

        run = compile_graph(program.graph, CompileOptions()).program
    positions = [i for i, _, _ in tensor_specs(program)]

    def call(arrays: list[np.ndarray]) -> list:
        leaves = [spec[1] if spec[0] == "python" else None for spec in program.in_specs]
        for position, array in zip(positions, arrays, strict=True):
            leaves[position] = make_tensor(array)
        inputs = bind(program.signature, leaves, program.parameters)
        return apply(program.signature, run(inputs), inputs, leaves, program.parameters)

    return call


# ---------------------------------------------------------------------- commands
def fused_graph(program):
    """The exported graph after the compile driver's fusion (kernel nodes with their bodies)."""
    from .compiler.driver import compile_graph  # noqa: PLC0415
    from .compiler.options import CompileOptions  # noqa: PLC0415

    return compile_graph(program.graph, CompileOptions()).graph


def show(args) -> None:
    program = load(args.file)
    graph, signature = program.graph, program.signature
    if args.fused:
        graph = fused_graph(program)
    inputs, outputs = signature_labels(signature, graph)
    print(f"{args.file}: exported kiln program, {len(program.graph.nodes)} nodes"
          + (f" ({len(graph.nodes)} after fusion)" if args.fused else ""))  # fmt: skip
    print("arguments:")
    for i, spec in enumerate(program.in_specs):
        print(f"  argument {i}: " + (f"{spec[2]}{list(spec[1])}" if spec[0] == "tensor" else f"{spec[1]!r} (fixed)"))
    params = program.parameters
    total = sum(t._data.nbytes for t in params.values())
    print(f"parameters: {len(params)} ({format_bytes(total)})")
    for name, t in params.items():
        print(f"  {name}: {t.dtype.short}{list(t.shape)}")
    print("results:")
    for words in result_words(signature, graph, inputs):
        print(f"  {words}")
    written = [label for label in outputs if "writes back" in label]
    if written:
        print(f"each call writes back {len(written)} input(s) it changes in place: {', '.join(written)}")
    counts = Counter(node.op for node in graph.nodes)
    print("ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())))
    kernels = [node for node in graph.nodes if node.op == "kernel"]
    for node in kernels:
        print(f"  {kernel_line(node)}")
    if not args.summary:
        from .ir.printer import print_graph  # noqa: PLC0415

        print()
        print(print_graph(graph, locations=not args.no_locations), end="")


def draw(args) -> None:
    from .ir.dot import render  # noqa: PLC0415

    program = load(args.file)
    graph = program.graph
    if args.fused:
        graph = fused_graph(program)
    inputs, outputs = signature_labels(program.signature, graph)
    text = graph.to_dot(name=Path(args.file).name, input_labels=inputs, output_labels=outputs,
                        collapse_kernels=args.collapse_kernels)  # fmt: skip
    try:
        path = render(text, args.output)
    except (RuntimeError, ValueError) as error:
        raise CommandError(str(error)) from None
    print(f"wrote {path}")


def to_onnx(args) -> None:
    import importlib.util  # noqa: PLC0415

    program = load(args.file)
    if importlib.util.find_spec("kiln.onnx") is None or not hasattr(program, "to_onnx"):
        raise CommandError("this kiln has no ONNX export (kiln.onnx and ExportedProgram.to_onnx are missing)")
    if args.dynamic_batch:
        # Which sizes follow the batch is learned by tracing the function at a second size; a file
        # holds one traced program, at the sizes it was traced at.
        raise CommandError(f"--dynamic-batch: {args.file} holds a program traced at one batch size, and which of its "
                           "sizes follow the batch cannot be told from it; export from the model instead, with "
                           "kiln.onnx.export(model, args, path, dynamic_axes={'input': {0: 'batch'}})")  # fmt: skip
    try:
        program.to_onnx(args.output, opset_version=args.opset, input_names=args.input_names,
                        output_names=args.output_names)  # fmt: skip
    except ImportError as error:
        raise CommandError(f"ONNX export needs the onnx package (pip install 'kiln[onnx]'): {error}") from None
    print(f"wrote {args.output}")


def leaf_paths(tree, prefix: str = "") -> list[str]:
    """Where each leaf of a result structure sits: ``""`` for a bare tensor, ``[0]``, ``['loss']``..."""
    if tree is None:  # pytree.LEAF
        return [prefix]
    if tree[0] is dict:
        return [p for key, sub in zip(tree[1], tree[2], strict=True) for p in leaf_paths(sub, f"{prefix}[{key!r}]")]
    return [p for i, sub in enumerate(tree[1]) for p in leaf_paths(sub, f"{prefix}[{i}]")]


def run(args) -> None:
    program = load(args.file)
    arrays = read_inputs(program, args.inputs or [])
    results = runner(program, not args.interpret)(arrays)
    named = {}
    for i, r in enumerate(results):
        named[f"output_{i}"] = r.numpy() if isinstance(r, Tensor) else np.asarray(r)
    paths = leaf_paths(program.out_tree)
    where = {key: f" (result{path})" if path else "" for key, path in zip(named, paths, strict=True)}
    if args.out:
        np.savez(args.out, **named)  # type: ignore[arg-type]  # keys are output_<i>, never allow_pickle
        print(f"wrote {args.out}: " + ", ".join(f"{k}{where[k]} {v.dtype}{list(v.shape)}" for k, v in named.items()))
    else:
        with np.printoptions(threshold=50, precision=5):
            for key, value in named.items():
                print(f"{key}{where[key]}: {value.dtype}{list(value.shape)}\n{value}")


def bench(args) -> None:
    program = load(args.file)
    arrays = read_inputs(program, args.inputs) if args.inputs else random_inputs(program)
    call = runner(program, not args.interpret)
    for _ in range(args.warmup):
        call(arrays)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        call(arrays)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    where = "interpreter" if args.interpret else "compiled"
    print(f"{args.file}: median {median * 1e3:.3f} ms per call ({where}; {args.repeat} calls after "
          f"{args.warmup} warm-up; min {min(times) * 1e3:.3f} ms, max {max(times) * 1e3:.3f} ms)")  # fmt: skip


# ---------------------------------------------------------------------- arguments
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kiln", description="Look at, draw, convert, run and time programs "
                                  "exported with kiln.export(...).save(path).")  # fmt: skip
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("show", help="the signature and graph of an exported program")
    p.add_argument("file", help="an exported program")
    p.add_argument("--summary", action="store_true", help="leave out the graph's text")
    p.add_argument("--no-locations", action="store_true", help="leave the source lines out of the graph's text")
    p.add_argument("--fused", action="store_true", help="the graph after fusion: one line per kernel, then its text")
    p.set_defaults(func=show)
    p = sub.add_parser("draw", help="a picture of the graph (Graphviz)")
    p.add_argument("file", help="an exported program")
    p.add_argument("-o", "--output", required=True,
                   help="graph.svg, .png or .pdf (need Graphviz's dot program) or graph.dot (the text)")  # fmt: skip
    p.add_argument("--fused", action="store_true", help="draw the graph after fusion: kernels as clusters")
    p.add_argument("--collapse-kernels", action="store_true", help="with --fused: one box per kernel")
    p.set_defaults(func=draw)
    p = sub.add_parser("to-onnx", help="convert to an ONNX model")
    p.add_argument("file", help="an exported program")
    p.add_argument("-o", "--output", required=True, help="model.onnx")
    p.add_argument("--opset", type=int, default=None, help="the ONNX opset version (default: kiln's choice)")
    p.add_argument("--input-names", nargs="+", default=None, help="names of the tensor inputs, in order")
    p.add_argument("--output-names", nargs="+", default=None, help="names of the outputs, in order")
    p.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="not for a file (it holds one batch size): says how to export a dynamic batch from the model",
    )
    p.set_defaults(func=to_onnx)
    for name, func, text in (("run", run, "run on inputs from .npy/.npz files"),
                             ("bench", bench, "median time per call")):  # fmt: skip
        p = sub.add_parser(name, help=text)
        p.add_argument("file", help="an exported program")
        p.add_argument("--inputs", nargs="+", default=None, metavar="FILE",
                       help="one .npy per tensor argument, in order, or one .npz"
                       + (" (default: random inputs of the signature's shapes)" if name == "bench" else ""))  # fmt: skip
        p.add_argument("--interpret", action="store_true", help="run on the IR interpreter instead of compiling")
        if name == "run":
            p.add_argument("--out", default=None, help="write the outputs to this .npz (output_0, output_1, ...)")
        else:
            p.add_argument("--warmup", type=int, default=10, help="calls before timing (default 10)")
            p.add_argument("--repeat", type=int, default=100, help="timed calls (default 100)")
        p.set_defaults(func=func)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    top = parser()
    args = top.parse_args(argv)
    if args.command == "bench" and (args.repeat < 1 or args.warmup < 0):
        top.error(f"bench: --repeat must be >= 1 and --warmup >= 0, got {args.repeat} and {args.warmup}")
    try:
        args.func(args)
    except CommandError as error:
        print(f"kiln {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output piped into a program that stopped reading (| head)
        sys.stdout = open(os.devnull, "w")  # Python flushes stdout at exit: not into the closed pipe
    return 0


if __name__ == "__main__":
    sys.exit(main())
