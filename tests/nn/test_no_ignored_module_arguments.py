"""No ``kiln.nn`` module accepts a constructor argument and ignores it (issue 38; the functional side
is tests/nn/test_no_ignored_arguments.py).

Each module below is built with every keyword of its constructor left at its default given another
value in turn (as the functional test chooses them), the same way in kiln and PyTorch; PyTorch's
parameters and buffers are copied into kiln's module, and the two forward passes (in eval mode, or in
training mode for the norms' batch statistics) are compared. Values PyTorch rejects are skipped;
values kiln rejects with an error are counted, and at most two per module are allowed.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import kiln
from tests.nn.test_loss_legacy_reduction import INPUTS
from tests.nn.test_no_ignored_arguments import _alternatives, _array, _same

rng = np.random.default_rng(5)


def _x(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# name -> (positional constructor arguments, the forward's inputs as numpy arrays, train)
MODULES = {
    "ReLU": ((), [_x(3, 4)], False), "ELU": ((), [_x(3, 4)], False), "LeakyReLU": ((), [_x(3, 4)], False),
    "GELU": ((), [_x(3, 4)], False), "Softplus": ((), [_x(3, 4)], False), "Hardtanh": ((), [_x(3, 4) * 2], False),
    "CELU": ((), [_x(3, 4)], False), "Softshrink": ((), [_x(3, 4)], False), "Hardshrink": ((), [_x(3, 4)], False),
    "Threshold": ((0.1, -1.0), [_x(3, 4)], False), "RReLU": ((), [_x(3, 4)], False),
    "Softmax": ((), [_x(3, 4)], False), "LogSoftmax": ((), [_x(3, 4)], False), "GLU": ((), [_x(3, 4)], False),
    "MaxPool1d": ((2,), [_x(1, 2, 7)], False), "MaxPool2d": ((2,), [_x(1, 2, 5, 5)], False),
    "AvgPool1d": ((2,), [_x(1, 2, 7)], False), "AvgPool2d": ((2,), [_x(1, 2, 5, 5)], False),
    "LPPool2d": ((2.0, 2), [_x(1, 2, 5, 5)], False), "AdaptiveAvgPool2d": ((3,), [_x(1, 2, 5, 5)], False),
    "AdaptiveMaxPool2d": ((3,), [_x(1, 2, 5, 5)], False),
    "BatchNorm1d": ((3,), [_x(4, 3)], True), "BatchNorm2d": ((3,), [_x(2, 3, 2, 2)], True),
    "LayerNorm": ((4,), [_x(3, 4)], False), "GroupNorm": ((2, 4), [_x(2, 4, 3)], False),
    "InstanceNorm1d": ((3,), [_x(2, 3, 5)], True), "LocalResponseNorm": ((2,), [_x(2, 3, 5)], False),
    "Linear": ((4, 3), [_x(2, 4)], False), "Bilinear": ((4, 3, 2), [_x(2, 4), _x(2, 3)], False),
    "Conv1d": ((2, 3, 3), [_x(1, 2, 8)], False), "Conv2d": ((2, 3, 3), [_x(1, 2, 6, 6)], False),
    "ConvTranspose2d": ((2, 3, 3), [_x(1, 2, 4, 4)], False),
    "Embedding": ((6, 3), [np.array([[0, 2, 5], [1, 1, 3]])], False),
    "RNN": ((3, 4), [_x(5, 2, 3)], False), "GRU": ((3, 4), [_x(5, 2, 3)], False), "LSTM": ((3, 4), [_x(5, 2, 3)], False),
    "Dropout": ((), [_x(3, 4)], False), "Flatten": ((), [_x(2, 3, 4)], False), "Unflatten": ((1, (2, 2)), [_x(3, 4)], False),
    "PixelShuffle": ((2,), [_x(1, 4, 2, 2)], False), "Upsample": ((None, 2), [_x(1, 2, 3, 3)], False),
    "CosineSimilarity": ((), [_x(3, 4), _x(3, 4)], False), "PairwiseDistance": ((), [_x(3, 4), _x(3, 4)], False),
    "ZeroPad2d": ((1,), [_x(1, 2, 3, 3)], False), "ReflectionPad1d": ((1,), [_x(1, 2, 4)], False),
}  # fmt: skip
LOSSES = {
    "NLLLoss": "nll_loss", "CrossEntropyLoss": "cross_entropy", "MSELoss": "mse_loss", "L1Loss": "l1_loss",
    "BCELoss": "binary_cross_entropy", "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
    "SmoothL1Loss": "smooth_l1_loss", "KLDivLoss": "kl_div", "SoftMarginLoss": "soft_margin_loss",
    "MarginRankingLoss": "margin_ranking_loss", "HingeEmbeddingLoss": "hinge_embedding_loss",
    "CosineEmbeddingLoss": "cosine_embedding_loss", "PoissonNLLLoss": "poisson_nll_loss",
    "TripletMarginLoss": "triplet_margin_loss", "MultiLabelSoftMarginLoss": "multilabel_soft_margin_loss",
    "MultiMarginLoss": "multi_margin_loss", "MultiLabelMarginLoss": "multilabel_margin_loss",
}  # fmt: skip
for _module, _functional in LOSSES.items():
    MODULES[_module] = ((), [np.asarray(a) for a in INPUTS[_functional]()], False)
NOT_VALUES = {"device", "dtype", "inplace", "_weight", "_freeze", "sparse", "scale_grad_by_freq", "batch_first"}


def _build(lib, name, args, kwargs, torch_module=None):
    module = getattr(lib.nn, name)(*args, **kwargs)
    if torch_module is not None and torch_module.state_dict():
        state = {k: kiln.tensor(v.detach().numpy().copy()) for k, v in torch_module.state_dict().items()}
        module.load_state_dict(state)
    return module


def _forward(lib, module, arrays, train):
    module.train(train)
    inputs = [lib.tensor(a) for a in arrays]
    out = module(*inputs)
    return out[0] if isinstance(out, tuple) and not isinstance(out[0], float) else out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_constructor_keyword_changes_the_module_as_pytorchs_does(name, torch):
    args, arrays, train = MODULES[name]
    signature = inspect.signature(getattr(kiln.nn, name).__init__)
    rejected = []
    for p in list(signature.parameters.values())[1 + len(args) :]:
        if p.default is inspect.Parameter.empty or p.name in NOT_VALUES:
            continue
        for value in _alternatives(p.name, p.default):
            try:
                torch.manual_seed(0)
                theirs = getattr(torch.nn, name)(*args, **{p.name: value})
                expected = _array(_forward(torch, theirs, arrays, train))
                torch.manual_seed(1)
                again = getattr(torch.nn, name)(*args, **{p.name: value})
                again.load_state_dict(theirs.state_dict())
                if not _same(expected, _array(_forward(torch, again, arrays, train))):
                    continue  # random: PyTorch's values change with its seed
            except Exception:  # noqa: BLE001 - PyTorch rejects the value: nothing to compare
                continue
            try:
                ours = _build(kiln, name, args, {p.name: value}, theirs)
                got = _array(_forward(kiln, ours, arrays, train))
            except (NotImplementedError, TypeError, ValueError, RuntimeError, KeyError) as error:
                rejected.append(f"{p.name}={value!r}: {type(error).__name__}: {error}")
                continue
            assert _same(got, expected), f"nn.{name}({p.name}={value!r}) differs from PyTorch's: ignored or wrong"
    assert len(rejected) <= 2, f"nn.{name} rejects values PyTorch takes: {rejected}"
