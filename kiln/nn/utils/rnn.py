"""Variable-length sequences for the recurrent layers: padding, and packing into a ``PackedSequence``.

A packed batch stores, for each time step t, the rows of the sequences still running at t (the
sequences sorted by length, longest first): ``data`` is those rows one step after another and
``batch_sizes[t]`` how many there are. ``sorted_indices`` / ``unsorted_indices`` map between the
caller's batch order and the sorted one (None when the caller's batch was already sorted).

>>> import kiln
>>> padded = pad_sequence([kiln.tensor([1.0, 2.0, 3.0]), kiln.tensor([4.0])], batch_first=True)
>>> padded.tolist()
[[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
>>> packed = pack_padded_sequence(padded, [3, 1], batch_first=True)
>>> packed.data.tolist(), packed.batch_sizes.tolist()
([1.0, 4.0, 2.0, 3.0], [2, 1, 1])
"""

from __future__ import annotations

from typing import NamedTuple

import kiln

__all__ = ["PackedSequence", "pad_sequence", "unpad_sequence", "pack_padded_sequence", "pad_packed_sequence",
           "pack_sequence", "unpack_sequence", "invert_permutation"]  # fmt: skip


class PackedSequence(NamedTuple):
    data: kiln.Tensor
    batch_sizes: kiln.Tensor
    sorted_indices: kiln.Tensor | None = None
    unsorted_indices: kiln.Tensor | None = None

    def to(self, *args, **kwargs) -> PackedSequence:
        """The same packing with ``data`` moved or cast (``batch_sizes`` stays an int64 CPU tensor)."""
        return self._replace(data=self.data.to(*args, **kwargs))

    def cpu(self) -> PackedSequence:
        return self._replace(data=self.data.cpu())

    @property
    def is_cuda(self) -> bool:
        return self.data.device.type == "cuda"

    def is_pinned(self) -> bool:
        return False


def invert_permutation(permutation):
    """The permutation that undoes ``permutation`` (None stays None)."""
    if permutation is None:
        return None
    inverse = kiln.empty_like(permutation)
    inverse[permutation] = kiln.arange(permutation.numel(), device=permutation.device)
    return inverse


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> kiln.Tensor:  # fmt: skip
    """Stack tensors of shape (L_i, *) into (max L, B, *) (or (B, max L, *)), filling with ``padding_value``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    longest = max(s.shape[0] for s in sequences)
    rows = []
    for s in sequences:
        missing = longest - s.shape[0]
        amounts = [0, 0] * (s.dim() - 1) + ([0, missing] if padding_side == "right" else [missing, 0])
        rows.append(kiln.nn.functional.pad(s, amounts, value=padding_value) if missing else s)
    return kiln.stack(rows, dim=0 if batch_first else 1)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False) -> list[kiln.Tensor]:
    """The inverse of ``pad_sequence``: a list of the (L_i, *) sequences."""
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, : int(n)] for i, n in enumerate(_lengths_list(lengths))]


def _lengths_list(lengths) -> list[int]:
    if isinstance(lengths, kiln.Tensor):
        if lengths.device.type != "cpu":
            raise RuntimeError("'lengths' argument should be a 1D CPU int64 tensor, but got a tensor on "
                               f"{lengths.device}")  # fmt: skip
        return [int(n) for n in lengths.tolist()]
    return [int(n) for n in lengths]


def pack_padded_sequence(input, lengths, batch_first: bool = False, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded (T, B, *) (or (B, T, *)) batch whose sequence b has ``lengths[b]`` valid steps."""
    lengths = _lengths_list(lengths)
    if any(n <= 0 for n in lengths):
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")  # fmt: skip
    x = input if not batch_first else input.transpose(0, 1)
    if len(lengths) != x.shape[1]:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                           f"(batch_size={x.shape[1]})")  # fmt: skip
    if enforce_sorted:
        if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                               "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
                               "to sidestep this requirement if you do not need ONNX exportability.")  # fmt: skip
        sorted_indices = None
    else:
        order = sorted(range(len(lengths)), key=lambda b: -lengths[b])  # stable, as torch.sort(descending=True)
        sorted_indices = kiln.tensor(order, dtype=kiln.int64, device=x.device)
        x = kiln.index_select(x, 1, sorted_indices)
        lengths = [lengths[b] for b in order]
    if lengths[0] > x.shape[0]:
        raise RuntimeError(f"pack_padded_sequence: a length ({lengths[0]}) exceeds the padded length ({x.shape[0]})")
    batch_sizes = [sum(1 for n in lengths if n > t) for t in range(lengths[0])]
    data = kiln.cat([x[t, :size] for t, size in enumerate(batch_sizes)], dim=0)
    return PackedSequence(data, kiln.tensor(batch_sizes, dtype=kiln.int64), sorted_indices,
                          invert_permutation(sorted_indices))  # fmt: skip


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[kiln.Tensor, kiln.Tensor]:  # fmt: skip
    """Unpack to a padded (T, B, *) (or (B, T, *)) tensor and the int64 lengths, in the caller's batch order."""
    data, batch_sizes = sequence.data, [int(b) for b in sequence.batch_sizes.tolist()]
    steps = len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ValueError(f"Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {steps}")  # fmt: skip
    batch = batch_sizes[0]
    rows, offset = [], 0
    for size in batch_sizes:
        piece = data[offset : offset + size]
        offset += size
        if size < batch:
            amounts = [0, 0] * (piece.dim() - 1) + [0, batch - size]
            piece = kiln.nn.functional.pad(piece, amounts, value=padding_value)
        rows.append(piece)
    padded = kiln.stack(rows, dim=0)
    if total_length is not None and total_length > steps:
        amounts = [0, 0] * (padded.dim() - 1) + [0, total_length - steps]
        padded = kiln.nn.functional.pad(padded, amounts, value=padding_value)
    lengths = kiln.tensor([sum(1 for size in batch_sizes if size > b) for b in range(batch)], dtype=kiln.int64)
    if sequence.unsorted_indices is not None:
        padded = kiln.index_select(padded, 1, sequence.unsorted_indices)
        lengths = kiln.index_select(lengths, 0, sequence.unsorted_indices.cpu())
    return (padded.transpose(0, 1) if batch_first else padded), lengths


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of (L_i, *) tensors."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[kiln.Tensor]:
    """The inverse of ``pack_sequence``: the list of (L_i, *) tensors."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
