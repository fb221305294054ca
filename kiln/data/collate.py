"""``default_collate`` / ``default_convert``: samples to batches, as PyTorch's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..frontend.ops.copies import stack
from ..frontend.ops.creation import as_tensor, from_numpy, tensor
from ..frontend.tensor import Tensor
from ..ir import dtypes as dt

__all__ = ["default_collate", "default_convert"]

_ERROR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _numeric_array(x) -> bool:
    return isinstance(x, np.ndarray | np.generic) and x.dtype.kind not in "USOa"


def default_convert(data):
    """Numpy arrays (and numpy scalars) to tensors inside dicts/lists/tuples; everything else unchanged."""
    if isinstance(data, Tensor):
        return data
    if _numeric_array(data):
        return from_numpy(np.array(data, order="C")) if isinstance(data, np.ndarray) else as_tensor(data)
    if isinstance(data, Mapping):
        out = {k: default_convert(v) for k, v in data.items()}
        return out if type(data) is dict else type(data)(out)
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return [default_convert(d) for d in data]
    return data


def default_collate(batch):
    """Stack a list of samples into a batch, recursing into dicts, namedtuples, tuples and lists."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(list(batch), 0)
    if _numeric_array(elem):
        if isinstance(elem, np.ndarray):
            return stack([from_numpy(np.array(b, order="C")) for b in batch], 0)
        return as_tensor(np.array(batch))
    if isinstance(elem, np.ndarray | np.generic):
        raise TypeError(_ERROR.format(f"numpy array of dtype {elem.dtype}"))
    if isinstance(elem, float):
        return tensor(batch, dtype=dt.float64)
    if isinstance(elem, int):  # bools included: a bool tensor
        return tensor(batch)
    if isinstance(elem, str | bytes):
        return list(batch)
    if isinstance(elem, Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return out if type(elem) is dict else type(elem)(out)
        except TypeError:
            return out
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(samples) for samples in zip(*batch, strict=True)))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(samples)) for samples in zip(*batch, strict=True)]
    raise TypeError(_ERROR.format(type(elem)))
