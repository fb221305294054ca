"""``kiln.nn`` layers: ``Module`` and its subclasses, PyTorch's names, parameters and defaults."""

from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Softplus, Tanh
from .containers import ModuleDict, ModuleList, ParameterList, Sequential
from .conv import Conv1d, Conv2d
from .dropout import Dropout
from .linear import Bilinear, Identity, Linear
from .loss import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .misc import Flatten, Unflatten
from .module import Module, RemovableHandle
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .pooling import AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from .sparse import Embedding

__all__ = [
    "Module", "RemovableHandle", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
    "Linear", "Bilinear", "Identity", "Conv1d", "Conv2d",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "Dropout", "Embedding", "Flatten", "Unflatten",
    "ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "BCELoss", "BCEWithLogitsLoss",
]  # fmt: skip
from .rnn import GRU, LSTM  # noqa: E402

__all__ += ["LSTM", "GRU"]
from .transformer import MultiheadAttention, TransformerEncoderLayer  # noqa: E402

__all__ += ["MultiheadAttention", "TransformerEncoderLayer"]
from .conv_transpose import ConvTranspose2d  # noqa: E402

__all__ += ["ConvTranspose2d"]
