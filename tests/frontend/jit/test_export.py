"""kiln.export: a traced program with its parameters, saved to one file and loaded without the code."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln import nn
from kiln.ir.verifier import VerificationError
from kiln.jit import ExportError, TraceBreakError

RTOL, ATOL = 1e-6, 1e-7  # a loaded program runs compiled (fused kernels): equal to float32 rounding


def _model() -> nn.Module:
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 3)).eval()


def test_exported_module_matches_eager_and_names_parameters_as_the_state_dict():
    model, x = _model(), kiln.randn(5, 4)
    program = kiln.export(model, x)
    assert set(program.parameters) <= set(model.state_dict())
    assert "0.weight" in program.parameters and "1.running_mean" in program.parameters
    with kiln.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(program(x).numpy(), expected, rtol=RTOL, atol=ATOL)
    other = kiln.randn(5, 4)
    with kiln.no_grad():
        np.testing.assert_allclose(program(other).numpy(), model(other).numpy(), rtol=RTOL, atol=ATOL)


def test_parameters_are_copied_at_export_time():
    model, x = _model(), kiln.randn(2, 4)
    program = kiln.export(model, x)
    before = program(x).numpy().copy()
    with kiln.no_grad():
        model[0].weight.add_(1.0)
    np.testing.assert_array_equal(program(x).numpy(), before)


def test_save_and_load_round_trip_with_nested_signature(tmp_path):
    w = kiln.randn(3, 3)

    def fn(inputs, scale):
        a, b = inputs["a"], inputs["b"]
        return {"sum": (a @ w + b) * scale, "pair": (a.relu(), scale)}

    args = ({"a": kiln.randn(2, 3), "b": kiln.randn(3)}, 2.0)
    program = kiln.export(fn, *args)
    path = tmp_path / "fn.kiln"
    program.save(path)
    loaded = kiln.load_exported(path)
    out, expected = loaded(*args), fn(*args)
    np.testing.assert_allclose(out["sum"].numpy(), expected["sum"].numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out["pair"][0].numpy(), expected["pair"][0].numpy(), rtol=RTOL, atol=ATOL)
    assert out["pair"][1] == 2.0 and isinstance(out["pair"], tuple)


def test_loads_and_runs_in_a_fresh_process_without_the_code(tmp_path):
    model, x = _model(), kiln.randn(4, 4)
    kiln.export(model, x).save(tmp_path / "model.kiln")
    np.save(tmp_path / "x.npy", x.numpy())
    with kiln.no_grad():
        np.save(tmp_path / "expected.npy", model(x).numpy())
    script = (
        "import numpy as np, kiln\n"
        f"program = kiln.load_exported({str(tmp_path / 'model.kiln')!r})\n"
        f"x = kiln.from_numpy(np.load({str(tmp_path / 'x.npy')!r}))\n"
        f"expected = np.load({str(tmp_path / 'expected.npy')!r})\n"
        "np.testing.assert_allclose(program(x).numpy(), expected, rtol=1e-6, atol=1e-7)\n"  # runs compiled: fused
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_repeated_results_and_views_of_arguments_survive_a_round_trip(tmp_path):
    def fn(x):
        y = x * 2
        return y, [y], x[1:]

    program = kiln.export(fn, kiln.arange(4.0))
    program.save(tmp_path / "fn.kiln")
    for p in (program, kiln.load_exported(tmp_path / "fn.kiln")):
        x = kiln.arange(4.0) + 1
        a, (b,), c = p(x)
        assert a is b  # one tensor returned twice is one object, as in eager
        np.testing.assert_array_equal(a.numpy(), [2.0, 4.0, 6.0, 8.0])
        np.testing.assert_array_equal(c.numpy(), [2.0, 3.0, 4.0])  # a view of the argument, as a value
        assert not np.shares_memory(c.numpy(), x.numpy())


def test_calls_must_match_the_example_signature():
    program = kiln.export(lambda x, n: x * n, kiln.randn(2, 3), 3)
    with pytest.raises(ValueError, match=r"argument 0 must be f32\[2, 3\], got f32\[4, 3\]"):
        program(kiln.randn(4, 3), 3)
    with pytest.raises(ValueError, match="argument 1 must be 3"):
        program(kiln.randn(2, 3), 4)
    with pytest.raises(TypeError, match="structure"):
        program(kiln.randn(2, 3))


def test_batchnorm_in_training_mode_updates_the_programs_buffers():
    model = _model().train()
    x = kiln.randn(6, 4)
    program = kiln.export(model, x)
    before = program.parameters["1.running_mean"].numpy().copy()
    program(x)
    assert not np.array_equal(program.parameters["1.running_mean"].numpy(), before)


def test_trace_breaks_and_grad_setting_functions_are_refused():
    with pytest.raises(TraceBreakError, match=r"Tensor.item\(\)"):
        kiln.export(lambda x: x * x.sum().item(), kiln.randn(3))
    w = kiln.randn(3, requires_grad=True)

    def sets_grad(x):
        with kiln.enable_grad():
            (w * x).sum().backward()
        return x

    with pytest.raises(ExportError, match="grad"):
        kiln.export(sets_grad, kiln.randn(3))


# ---------------------------------------------------------------------- damaged files
@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "p.kiln"
    kiln.export(lambda x: F.relu(x) + 1.0, kiln.randn(3)).save(path)
    return path


def _rewrite_header(path, edit) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    # Tensor offsets count from the end of the header, so a longer header moves nothing else.
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])


def test_newer_export_format_is_refused(saved):
    def bump(header):
        meta = json.loads(header["__metadata__"]["metadata"])
        meta["export_format_version"] = 99
        header["__metadata__"]["metadata"] = json.dumps(meta)

    _rewrite_header(saved, bump)
    with pytest.raises(ExportError, match="newer"):
        kiln.load_exported(saved)


def test_tampered_graph_is_refused(saved):
    def retype(header):
        graph = json.loads(header["__metadata__"]["graph"])
        graph["nodes"][0]["outputs"][0]["type"]["shape"] = [7]
        header["__metadata__"]["graph"] = json.dumps(graph)

    _rewrite_header(saved, retype)
    with pytest.raises(VerificationError):
        kiln.load_exported(saved)


def test_tampered_signature_is_refused(saved):
    def rename(header):
        meta = json.loads(header["__metadata__"]["metadata"])
        meta["inputs"] = [["param", "nothing"]]
        header["__metadata__"]["metadata"] = json.dumps(meta)

    _rewrite_header(saved, rename)
    with pytest.raises(ExportError, match="not a valid exported program"):
        kiln.load_exported(saved)


def test_truncated_file_is_refused(saved):
    saved.write_bytes(saved.read_bytes()[:-5])
    with pytest.raises(ValueError, match=str(saved.name)):
        kiln.load_exported(saved)


def _edit_signature(**changes):
    def edit(header):
        meta = json.loads(header["__metadata__"]["metadata"])
        meta.update(changes)
        header["__metadata__"]["metadata"] = json.dumps(meta)

    return edit


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"inputs": [["arg", 5]]}, r"graph input %0 reads argument 5, but the signature has 1 arguments"),
        ({"in_specs": [["tensor", [3], "f128"]]}, r"unknown dtype 'f128' \(kiln's are bool, u8, .*f64\)"),
        ({"in_specs": [["tensor", [3], "f64"]]}, r"graph input %0 is f32\[3\] in the graph, but argument 0 is f64\[3\]"),
        ({"in_specs": [["tensor", [4], "f32"]]}, r"graph input %0 is f32\[3\] in the graph, but argument 0 is f32\[4\]"),
        ({"in_specs": [["python", 2.0]]}, "graph input %0 reads argument 0, which is 2.0 in the signature, not a tensor"),
        ({"in_specs": [["tensor", [3], "f32"]] * 2}, "the structure of the arguments has 1 leaves, the signature lists 2"),
        ({"outputs": [["arg", 7]]}, "result 0 reads argument 7, but the signature has 1 arguments"),
        ({"outputs": [["value", 3]]}, r"ValueError: index 3 out of range"),
        ({"in_tree": {"tuple": [{"tuple": [None]}, {"dict": [[1]]}]}}, "not a valid exported program"),
        ({"in_tree": json.loads("[" * 400 + "]" * 400)}, "not a valid exported program"),
        ({"export_format_version": "1"}, r"its export_format_version must be an integer >= 1, got '1' \(str\)"),
    ],
)  # fmt: skip
def test_a_damaged_signature_is_refused_at_load(saved, changes, message):
    _rewrite_header(saved, _edit_signature(**changes))
    with pytest.raises(ExportError, match=rf"{saved.name}: .*{message}"):
        kiln.load_exported(saved)


def test_a_long_dtype_name_in_the_signature_is_read_as_kiln_writes_it(saved):
    _rewrite_header(saved, _edit_signature(in_specs=[["tensor", [3], "float32"]]))
    x = kiln.randn(3)
    np.testing.assert_array_equal(kiln.load_exported(saved)(x).numpy(), (F.relu(x) + 1.0).numpy())


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"dtype": "I32"}, r"graph input %1 is f32\[3\] in the graph, but parameter 'capture_1' is i32\[3\]"),
        ({"shape": [1, 3]}, r"graph input %1 is f32\[3\] in the graph, but parameter 'capture_1' is f32\[1, 3\]"),
    ],
)
def test_a_parameter_that_differs_from_the_graph_is_refused_at_load(tmp_path, entry, message):
    w = kiln.randn(3)
    path = tmp_path / "w.kiln"
    program = kiln.export(lambda x: x * w, kiln.randn(3))
    assert list(program.parameters) == ["capture_1"]
    program.save(path)
    _rewrite_header(path, lambda header: header["tensors/capture_1"].update(entry))
    with pytest.raises(ExportError, match="w.kiln: not a valid exported program: " + message):
        kiln.load_exported(path)


def test_a_pytorch_file_is_named(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04" + bytes(22) + struct.pack("<H", 16) + bytes(2) + b"archive/data.pkl" + bytes(64))
    with pytest.raises(ValueError, match=r"model.pt: not a readable safetensors file: it is a PyTorch checkpoint"):
        kiln.load_exported(path)


class _Tracker(nn.Module):
    """A buffer updated in place on each call: the exported program writes it back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("mean", kiln.zeros(3))

    def forward(self, x):
        y = self.lin(x)
        self.mean.mul_(0.5).add_(y.mean(0) * 0.5)
        return y - self.mean


@pytest.mark.parametrize("make", [_model, _Tracker])
def test_compiling_a_loaded_program_follows_its_inputs(tmp_path, make):
    # kiln.compile(kiln.load_exported(p)) must give the program's own results for every input, not the
    # first call's (the program's call read its arguments' memory behind the trace's back).
    kiln.manual_seed(0)
    model = make()
    path = tmp_path / "model.kiln"
    kiln.export(model, kiln.randn(5, 4)).save(path)
    program, reference = kiln.load_exported(path), kiln.load_exported(path)
    compiled = kiln.compile(program)
    for i in range(5):
        x = kiln.randn(5, 4) * float(i + 1)
        np.testing.assert_allclose(compiled(x).numpy(), reference(x).numpy(), rtol=1e-6, atol=1e-6)
        for name, t in reference.parameters.items():  # BatchNorm's running statistics in training mode
            np.testing.assert_allclose(program.parameters[name].numpy(), t.numpy(), rtol=1e-6, atol=1e-6)
    specs = compiled.state.specializations
    assert len(specs) == 1 and specs[0].calls == 4  # the compiled program ran, no trace break


def test_a_trace_that_reaches_a_programs_bind_stops():
    # a program run on arrays (not through kiln's ops) inside a trace: that call runs eagerly, said
    from kiln.frontend.jit.signature import Argument, Result, Signature, bind

    signature = Signature([Argument(0)], [Result(0)], [], devices=(kiln.ones(1).device,))
    f = kiln.compile(lambda x: kiln.tensor(bind(signature, [x])[0] * 2.0))
    for i in range(3):
        x = kiln.full((2,), float(i))
        np.testing.assert_allclose(f(x).numpy(), np.full(2, 2.0 * i))
    assert any("outside kiln's ops" in e.detail for e in f.state.events if e.kind == "break")


def test_a_program_with_a_0_d_buffer_saves_and_loads(tmp_path):
    """BatchNorm's num_batches_tracked is 0-d; the writer made it shape [1] (np.ascontiguousarray
    lifts 0-d arrays), and load_exported refused the file."""
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(3, 4), kiln.nn.BatchNorm1d(4))  # training: the counter is read
    x = kiln.randn(5, 3)
    program = kiln.export(model, x)
    program.save(tmp_path / "bn.kiln")
    loaded = kiln.load_exported(tmp_path / "bn.kiln")
    assert loaded.parameters["1.num_batches_tracked"].shape == ()
    with kiln.no_grad():
        expected = model(x)  # batch statistics: the same output from the same batch
    np.testing.assert_allclose(loaded(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_a_loaded_program_runs_compiled_and_equals_its_interpreter(tmp_path):
    """load_exported's program runs through the compile driver (LLVM for the CPU, the disk cache), not
    node by node on the interpreter; its results equal the interpreter's over several inputs."""
    from kiln.frontend.jit.signature import apply, bind

    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Conv2d(1, 4, 3), kiln.nn.ReLU(), kiln.nn.Flatten(), kiln.nn.Linear(4 * 36, 3))
    kiln.export(model.eval(), kiln.randn(2, 1, 8, 8)).save(tmp_path / "cnn.kiln")
    loaded = kiln.load_exported(tmp_path / "cnn.kiln")
    for _ in range(3):
        x = kiln.randn(2, 1, 8, 8)
        arrays = bind(loaded.signature, [x], loaded.parameters)
        (expected,) = apply(loaded.signature, loaded._interpreted(arrays), arrays, [x], loaded.parameters)
        np.testing.assert_allclose(loaded(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    assert loaded._program is not None and hasattr(loaded._program, "kernel_calls")  # a compiled program
