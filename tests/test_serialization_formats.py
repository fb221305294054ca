"""kiln.save/kiln.load beyond plain containers: numpy, pickled objects under weights_only, safe globals,
PyTorch's own checkpoints (read without torch), safetensors both ways, malicious and corrupt files."""

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.serialization import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals


def _roundtrip(obj, **kw):
    buffer = io.BytesIO()
    kiln.save(obj, buffer)
    buffer.seek(0)
    return kiln.load(buffer, **kw)


class Config:  # a user's class, pickled into the checkpoint
    def __init__(self, lr, layers):
        self.lr, self.layers = lr, layers

    def __eq__(self, other):
        return vars(self) == vars(other)


class System:
    """Pickles into ``os.system(command)``: loading it would run a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_numpy_dtypes_devices_sizes_and_parameters_are_stored_without_pickle():
    obj = {
        "array": np.arange(6, dtype=np.int16).reshape(2, 3).T,  # non-contiguous
        "scalar": np.float64(2.5),
        "int": np.int32(-3),
        "dtype": kiln.float16,
        "device": kiln.device("cpu"),
        "size": kiln.Size([2, 3]),
        "param": nn.Parameter(kiln.ones(2)),
    }
    out = _roundtrip(obj)  # weights_only=True: none of these needs pickle
    assert out["array"].dtype == np.int16 and out["array"].tolist() == obj["array"].tolist()
    assert type(out["scalar"]) is np.float64 and out["scalar"] == 2.5 and type(out["int"]) is np.int32
    assert out["dtype"] is kiln.float16 and out["device"] == kiln.device("cpu")
    assert type(out["size"]) is kiln.Size and out["size"] == (2, 3)
    assert type(out["param"]) is nn.Parameter and out["param"].requires_grad and out["param"].tolist() == [1, 1]


def test_numpy_arrays_of_other_dtypes_are_pickled_and_still_load_weights_only():
    obj = {"u16": np.arange(3, dtype=np.uint16), "c": np.array([1 + 2j], np.complex64), "s": np.array(["ab", "c"])}
    out = _roundtrip(obj)
    for key, value in obj.items():
        assert out[key].dtype == value.dtype and out[key].tolist() == value.tolist(), key


def test_tensors_are_named_by_their_place_so_safetensors_reads_a_state_dict(torch, tmp_path):
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    path = tmp_path / "model.safetensors"
    kiln.save(model.state_dict(), path)
    loaded = load_file(str(path))
    assert sorted(loaded) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded[key].numpy(), value.numpy())
    kiln.save({"model": {"w": kiln.ones(1)}, "model.w": kiln.zeros(1), "list": [kiln.ones(1)]}, path)
    assert sorted(load_file(str(path))) == ["list.0", "model.w", "model.w#2"]


def test_pickled_objects_need_weights_only_false_or_safe_globals():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    x = kiln.randn(5, 3)
    with pytest.raises(pickle.UnpicklingError, match=r"names the global kiln.nn.modules.\w+.Sequential, which "
                                                     r"is not allowed by default.*weights_only=False"):  # fmt: skip
        _roundtrip({"model": model})
    out = _roundtrip({"model": model, "step": 3}, weights_only=False)
    assert out["step"] == 3 and type(out["model"]) is nn.Sequential
    np.testing.assert_array_equal(out["model"](x).detach().numpy(), model(x).detach().numpy())
    assert all(type(p) is nn.Parameter for p in out["model"].parameters())

    config = Config(0.1, [3, 4])
    with pytest.raises(pickle.UnpicklingError, match=rf"add_safe_globals\(\[{__name__}.Config\]\)"):
        _roundtrip({"config": config})
    with safe_globals([Config]):
        assert get_safe_globals() == [Config]
        assert _roundtrip({"config": config})["config"] == config
    assert get_safe_globals() == []
    add_safe_globals([Config])
    try:
        assert _roundtrip(config) == config
    finally:
        clear_safe_globals()
    with pytest.raises(TypeError, match="expected classes or functions"):
        add_safe_globals([3])


def test_a_malicious_kiln_checkpoint_is_refused_under_weights_only(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.kiln"
    kiln.save({"w": kiln.ones(2), "x": System(f"touch {marker}")}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"evil.kiln' \(at obj\['x'\]\) names the global posix.system"):
        kiln.load(path)
    with pytest.raises(pickle.UnpicklingError, match="posix.system"):
        kiln.load(path, weights_only=True)
    assert not marker.exists()
    # a bare pickle gets the same treatment
    path.write_bytes(pickle.dumps({"x": System(f"touch {marker}")}))
    with pytest.raises(pickle.UnpicklingError, match="names the global posix.system"):
        kiln.load(path)
    assert not marker.exists()
    assert kiln.load(io.BytesIO(pickle.dumps({"a": [1, 2.5], "b": np.ones(2)})))["b"].tolist() == [1, 1]


class TinyNet:
    """The same network in torch and in kiln (a conv, a batch norm with its buffers, a linear head)."""

    @staticmethod
    def build(lib):
        return lib.nn.Sequential(
            lib.nn.Conv2d(2, 4, 3, padding=1), lib.nn.BatchNorm2d(4), lib.nn.ReLU(), lib.nn.Flatten(),
            lib.nn.Linear(4 * 5 * 5, 3),
        )  # fmt: skip


def test_pretrained_torch_weights_round_trip(torch, tmp_path):
    torch.manual_seed(0)
    reference = TinyNet.build(torch)
    reference.train()(torch.randn(8, 2, 5, 5))  # running statistics that are not the defaults
    reference.eval()
    path = tmp_path / "pretrained.pth"
    torch.save(reference.state_dict(), path)

    model = TinyNet.build(kiln)
    state = kiln.load(path)  # torch's zip format, read without torch
    assert type(state) is OrderedDict and list(state) == list(reference.state_dict())
    assert state["1.num_batches_tracked"].dtype == kiln.int64
    model.load_state_dict(state)
    model.eval()
    x = np.random.default_rng(0).standard_normal((3, 2, 5, 5)).astype(np.float32)
    expected = reference(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(kiln.from_numpy(x)).detach().numpy(), expected, rtol=1e-5, atol=1e-6)

    # and back: kiln's file is a safetensors file that torch's safetensors reader loads into torch's model
    from safetensors.torch import load_file

    back = tmp_path / "back.safetensors"
    kiln.save(model.state_dict(), back)
    again = TinyNet.build(torch)
    again.load_state_dict(load_file(str(back)))
    np.testing.assert_array_equal(again.eval()(torch.from_numpy(x)).detach().numpy(), expected)


@pytest.mark.parametrize("zip_format", [True, False])
def test_torch_views_offsets_and_shared_storages(torch, zip_format):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    obj = {"base": base, "view": base[1:, ::2], "t": base.t(), "col": base[:, 5], "alone": torch.ones(3, dtype=torch.int32),
           "empty": torch.zeros(0, 3), "scalar": torch.tensor(7), "flags": torch.tensor([True, False]),
           "half": torch.tensor([1.5, -2.0], dtype=torch.float16), "grad": torch.ones(2, requires_grad=True),
           "param": torch.nn.Parameter(torch.zeros(2)), "meta": (torch.float32, torch.Size([1, 2]), torch.device("cpu"))}  # fmt: skip
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=zip_format)  # False: the pre-1.6 legacy format
    buffer.seek(0)
    out = kiln.load(buffer)
    for key, value in obj.items():
        if isinstance(value, torch.Tensor):
            assert out[key].shape == tuple(value.shape), key
            assert out[key].stride() == value.stride() and out[key].storage_offset() == value.storage_offset(), key
            np.testing.assert_array_equal(out[key].detach().numpy(), value.detach().numpy())
            assert out[key].requires_grad == value.requires_grad, key
    assert out["half"].dtype == kiln.float16 and out["flags"].dtype == kiln.bool and out["scalar"].dtype == kiln.int64
    assert type(out["param"]) is nn.Parameter
    assert out["meta"] == (kiln.float32, kiln.Size([1, 2]), kiln.device("cpu"))
    out["base"][1, 0] = -1.0  # one storage in torch, one memory in kiln
    assert out["view"][0, 0].item() == -1.0 and out["t"][0, 1].item() == -1.0


def test_torch_checkpoint_from_an_unseekable_stream_and_map_location(torch):
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)

    class Pipe(io.RawIOBase):
        def __init__(self, data):
            self.data = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            chunk = self.data.read(min(len(b), 5))
            b[: len(chunk)] = chunk
            return len(chunk)

    seen = []
    out = kiln.load(Pipe(buffer.getvalue()), map_location=lambda t, location: seen.append(location) or t + 1)
    assert seen == ["cpu"] and out["w"].tolist() == [2, 2]


def _torch_zip(pickled: bytes, storages: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", b"little")
        for key, data in storages.items():
            archive.writestr(f"archive/data/{key}", data)
    return buffer.getvalue()


def _rebuild_pickle(size, stride, offset=0, numel=4) -> bytes:
    """A data.pkl of ``{"w": _rebuild_tensor_v2(FloatStorage '0', ...)}``, opcode by opcode as torch writes it."""

    def integer(n):
        return b"J" + struct.pack("<i", n)

    def text(s):
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def tuple_(*items):
        return b"(" + b"".join(items) + b"t"

    storage = tuple_(text("storage"), b"ctorch\nFloatStorage\n", text("0"), text("cpu"), integer(numel)) + b"Q"
    hooks = b"ccollections\nOrderedDict\n)R"
    args = tuple_(storage, integer(offset), tuple_(*map(integer, size)), tuple_(*map(integer, stride)), b"\x89", hooks)
    return b"\x80\x02}" + text("w") + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"Rs."


def test_legacy_checkpoints_are_checked_against_their_size(torch, tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(1000.0)}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    assert kiln.load(path)["w"].tolist() == list(range(1000))
    path.write_bytes(data[:-4])
    with pytest.raises(ValueError, match="legacy.pt' is truncated: storage '.*' ends after 3996 of 4000 bytes"):
        kiln.load(path)
    path.write_bytes(data[: len(data) // 2])  # refused before 4000 bytes are allocated for it
    with pytest.raises(ValueError, match="legacy.pt' is truncated or corrupt: storage '.*' declares 4000 bytes, "
                                         "more than the file has left"):  # fmt: skip
        kiln.load(path)
    end = len(data) - 4000 - 8  # the storage's count, before its bytes
    assert data[end : end + 8] == struct.pack("<q", 1000)
    path.write_bytes(data[:end] + struct.pack("<q", 999) + data[end + 8 :])
    with pytest.raises(ValueError, match="should start with its count 1000"):
        kiln.load(path)


def test_crafted_torch_checkpoints_cannot_reach_outside_their_storage(tmp_path):
    path = tmp_path / "crafted.pt"
    good = _torch_zip(_rebuild_pickle((2, 2), (2, 1)), {"0": np.arange(4, dtype=np.float32).tobytes()})
    path.write_bytes(good)
    assert kiln.load(path)["w"].tolist() == [[0, 1], [2, 3]]
    path.write_bytes(_torch_zip(_rebuild_pickle((2, 2), (4, 1)), {"0": bytes(16)}))
    with pytest.raises(ValueError, match=r"crafted.pt' is corrupt: a tensor of size \[2, 2\], stride \[4, 1\] and "
                                         "offset 0 reaches element 5 of a storage of 4"):  # fmt: skip
        kiln.load(path)
    path.write_bytes(_torch_zip(_rebuild_pickle((2,), (-1,)), {"0": bytes(16)}))
    with pytest.raises(ValueError, match="is corrupt: a tensor has offset 0, size"):
        kiln.load(path)
    path.write_bytes(_torch_zip(_rebuild_pickle((2, 2), (2, 1)), {"0": bytes(12)}))
    with pytest.raises(ValueError, match="storage '0' should hold 4 float32 values \\(16 bytes\\), its data has 12"):
        kiln.load(path)
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="crafted.pt' is a damaged zip archive"):
        kiln.load(path)
    path.write_bytes(_torch_zip(b"\x80\x02}q\x00(X", {}))
    with pytest.raises(ValueError, match="crafted.pt' is a corrupt PyTorch checkpoint"):
        kiln.load(path)


def test_a_tensor_under_the_metadata_key_is_renamed_loudly(tmp_path):
    import safetensors.numpy

    path = tmp_path / "m.safetensors"
    with pytest.warns(
        UserWarning, match=r"'__metadata__' is the name safetensors gives its metadata.*'__metadata__#2'"
    ):
        kiln.save({"__metadata__": kiln.ones(2), "w": kiln.zeros(1)}, path)  # the header's entry was overwritten
    plain = safetensors.numpy.load_file(str(path))
    assert sorted(plain) == ["__metadata__#2", "w"] and plain["__metadata__#2"].tolist() == [1.0, 1.0]
    out = kiln.load(path)
    assert sorted(out) == ["__metadata__", "w"] and out["__metadata__"].tolist() == [1.0, 1.0]


def test_tied_weights_are_every_key_of_the_safetensors_file_and_one_tensor_in_kiln(tmp_path):
    import safetensors.numpy

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

    model = Tied()
    state = model.state_dict(keep_vars=True)  # the tied Parameter itself under both keys
    path = tmp_path / "tied.safetensors"
    kiln.save(state, path)
    plain = safetensors.numpy.load_file(str(path))
    assert sorted(plain) == sorted(state) == ["emb.weight", "head.weight"]  # safetensors saw emb.weight only
    for key, value in state.items():
        np.testing.assert_array_equal(plain[key], value.detach().numpy())
    out = kiln.load(path)
    assert out["emb.weight"] is out["head.weight"]
    again = Tied()
    again.load_state_dict(out)
    np.testing.assert_array_equal(again.head.weight.detach().numpy(), model.emb.weight.detach().numpy())
