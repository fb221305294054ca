"""The CUDA backend: kernel nodes as generated ``numba.cuda.jit`` source, run on device arrays.

Why generated Python source rather than numba's own IR: the source is the whole of the code (it
is what the disk cache stores, what ``dump_dir`` can show and what a bug report quotes), numba
compiles it to PTX on a GPU, and Numba's CUDA simulator runs the very same text on numpy arrays,
which is how CI tests it without a GPU. ``generate`` writes one module for every kernel of a
program; a kernel the generator declines runs on the interpreter (``report.declined``).
``load`` executes the module in the runtime's namespace (kiln/codegen/cuda/runtime.py) and
builds ``kiln.runtime.cuda_executor.CudaProgram``.

Chosen for graphs on ``cuda`` devices; ``CompileOptions(backend="cuda")`` picks it for any graph,
which is how the tests run it under the simulator on CPU tensors.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from ...ir.graph import KERNEL, Graph, Node
from ..backend import Lowered, LoweringReport
from ..core import Unsupported
from .core import SUPPORTED, CudaModule
from .kernels import Config, Launch, generate
from .runtime import simulator

logger = logging.getLogger("kiln")

#: launch geometry under the simulator: small blocks (each simulated thread is a Python thread)
#: and few of them, so that the grid-stride loops and the cross-warp step still run
SIMULATOR_CONFIG = Config(threads=32, block=64, max_blocks=2)


@dataclass
class CudaCode:
    """The module's source and, per kernel node (by position in the graph), its launches."""

    source: str
    kernels: dict[int, list[Launch]]


def config() -> Config:
    return SIMULATOR_CONFIG if simulator() else Config()


class CudaBackend:
    """See the module docstring."""

    name = "cuda"
    stages: tuple[str, ...] = ("fuse", "infer_layouts", "choose_write_backs", "plan_memory")

    def declines(self, node: Node) -> str | None:
        for v in (*node.inputs, *node.outputs):
            if v.type.dtype.name not in SUPPORTED:
                return f"{v.type.dtype.name} has no CUDA kernels"
        return None

    def signature(self) -> str:
        import numba  # noqa: PLC0415

        try:
            from numba_cuda import __version__ as numba_cuda  # type: ignore[import-not-found]  # noqa: PLC0415
        except ImportError:
            numba_cuda = "?"
        target = "simulator" if simulator() else _device_name()
        return f"numba {numba.__version__}; numba-cuda {numba_cuda}; {target}; {config()}"

    def generate(self, lowered: Lowered, report: LoweringReport) -> CudaCode:
        module = CudaModule()
        kernels: dict[int, list[Launch]] = {}
        cfg = config()
        for position, node in enumerate(lowered.graph.nodes):
            if node.op != KERNEL:
                continue
            strides = [_element_strides(v, lowered.layouts[v]) for v in node.inputs]
            saved = (list(module.functions), list(module.kernels))
            try:
                kernels[position] = generate(module, f"k{position}", node, strides, cfg)
            except Unsupported as declined:
                module.functions[:], module.kernels[:] = saved
                report.declined.append((node.attrs["name"], str(declined)))
            except Exception as error:  # noqa: BLE001 - a code generator bug costs this kernel only
                if os.environ.get("KILN_JIT_STRICT") == "1":
                    raise
                module.functions[:], module.kernels[:] = saved
                why = f"the CUDA code generator failed ({type(error).__name__}: {error}); a bug in kiln"
                logger.warning("kiln.compile: kernel %s runs on the interpreter: %s", node.attrs["name"], why)
                report.declined.append((node.attrs["name"], why))
        report.kernels = sum(len(v) for v in kernels.values())
        return CudaCode(module.text(), kernels)

    def load(self, lowered: Lowered, code: CudaCode):
        from ...runtime.cuda_executor import CudaProgram  # noqa: PLC0415 - numba is imported here
        from .runtime import namespace  # noqa: PLC0415

        simulated = simulator()
        ns = namespace(simulated)
        exec(compile(code.source, "<kiln cuda kernels>", "exec"), ns)  # noqa: S102 - kiln's generated code
        nodes = lowered.graph.nodes
        launches = {nodes[p]: [(ns[launch.function], launch) for launch in ls] for p, ls in code.kernels.items()}
        return CudaProgram(lowered.graph, launches, lowered.plan, lowered.layouts, lowered.write_backs, config(),
                           simulated)  # fmt: skip

    def encode(self, code: CudaCode) -> bytes:
        kernels = {
            str(p): [[ln.function, list(ln.operands), list(ln.grid)] for ln in ls] for p, ls in code.kernels.items()
        }
        return json.dumps({"source": code.source, "kernels": kernels}).encode()

    def decode(self, data: bytes, graph: Graph) -> CudaCode:
        payload = json.loads(data)
        kernels = {}
        for p, ls in payload["kernels"].items():
            if graph.nodes[int(p)].op != KERNEL:
                raise ValueError(f"node {p} of the stored graph is not a kernel")
            kernels[int(p)] = [Launch(f, tuple(ops), tuple(grid)) for f, ops, grid in ls]
        return CudaCode(payload["source"], kernels)


def _element_strides(value, strides: tuple) -> tuple[int, ...]:
    size = value.type.dtype.itemsize
    return tuple(s // size for s in strides)


def _device_name() -> str:
    from numba import cuda  # noqa: PLC0415

    device = cuda.get_current_device()
    return f"{device.name!r} cc {device.compute_capability}"
