"""``kiln.nn.utils``: gradient clipping, parameters as one vector, and ``rnn`` (padding and packing sequences)."""

from . import clip_grad, rnn
from .clip_grad import clip_grad_norm_, clip_grad_value_, parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad", "rnn", "clip_grad_norm_", "clip_grad_value_", "parameters_to_vector",
           "vector_to_parameters"]  # fmt: skip
