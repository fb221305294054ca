# mypy: disable-error-code="attr-defined,call-arg,assignment"
# reason: mixins that reach the Module they are mixed into (its parameters, hooks and layer attributes)
"""Lazy modules: ``in_features`` / ``in_channels`` / ``num_features`` taken from the first input.

Until the first call the parameters are ``UninitializedParameter``s; the first forward materializes
them in place (the objects an optimizer already holds), runs the regular initialization, and turns
the module into its regular class (``LazyLinear`` becomes ``Linear``).
"""

from __future__ import annotations

from ..parameter import UninitializedParameter
from .conv import Conv1d, Conv2d, Conv3d
from .conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .linear import Linear
from .normalization import BatchNorm1d, BatchNorm2d, BatchNorm3d

__all__ = ["LazyModuleMixin", "LazyLinear", "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d",
           "LazyConvTranspose2d", "LazyConvTranspose3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyInstanceNorm1d",
           "LazyInstanceNorm2d", "LazyInstanceNorm3d"]  # fmt: skip


class LazyModuleMixin:
    """Infers the missing size from the first input, then becomes ``cls_to_become``."""

    cls_to_become: type | None = None

    def _start_lazy(self) -> None:
        self._lazy_hook = self.register_forward_pre_hook(_infer_and_become)

    def has_uninitialized_params(self) -> bool:
        tensors = [*self._parameters.values(), *self._buffers.values()]
        return any(isinstance(t, UninitializedParameter) for t in tensors)


def _infer_and_become(module, args) -> None:
    module.initialize_parameters(*args)
    module._lazy_hook.remove()
    del module._lazy_hook
    if module.cls_to_become is not None:
        module.__class__ = module.cls_to_become


def _uninitialized(module, names, device, dtype) -> None:
    for name in names:
        if getattr(module, name, None) is not None:
            setattr(module, name, UninitializedParameter(device=device, dtype=dtype))


class LazyLinear(LazyModuleMixin, Linear):
    """``Linear`` whose ``in_features`` is the last dim of the first input."""

    cls_to_become = Linear

    def __init__(self, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(0, out_features, bias, device=device, dtype=dtype)
        _uninitialized(self, ("weight", "bias"), device, dtype)
        self._start_lazy()

    def initialize_parameters(self, input) -> None:
        self.in_features = input.shape[-1]
        self.weight.materialize((self.out_features, self.in_features))
        if self.bias is not None:
            self.bias.materialize((self.out_features,))
        self.reset_parameters()


class _LazyConv(LazyModuleMixin):
    _transposed = False

    def __init__(self, out_channels: int, kernel_size, *args, device=None, dtype=None, **kwargs) -> None:
        super().__init__(self._groups_of(kwargs), out_channels, kernel_size, *args, device=device, dtype=dtype,
                         **kwargs)  # fmt: skip
        _uninitialized(self, ("weight", "bias"), device, dtype)
        self._start_lazy()

    @staticmethod
    def _groups_of(kwargs) -> int:
        return kwargs.get("groups", 1)  # a placeholder in_channels that divides by groups

    def initialize_parameters(self, input) -> None:
        d = len(self.kernel_size)
        self.in_channels = input.shape[0] if input.dim() == d + 1 else input.shape[1]
        groups = self.groups
        if self._transposed:
            shape = (self.in_channels, self.out_channels // groups, *self.kernel_size)
        else:
            shape = (self.out_channels, self.in_channels // groups, *self.kernel_size)
        self.weight.materialize(shape)
        if self.bias is not None:
            self.bias.materialize((self.out_channels,))
        self.reset_parameters()


class LazyConv1d(_LazyConv, Conv1d):
    cls_to_become = Conv1d


class LazyConv2d(_LazyConv, Conv2d):
    cls_to_become = Conv2d


class LazyConv3d(_LazyConv, Conv3d):
    cls_to_become = Conv3d


class LazyConvTranspose1d(_LazyConv, ConvTranspose1d):
    cls_to_become = ConvTranspose1d
    _transposed = True


class LazyConvTranspose2d(_LazyConv, ConvTranspose2d):
    cls_to_become = ConvTranspose2d
    _transposed = True


class LazyConvTranspose3d(_LazyConv, ConvTranspose3d):
    cls_to_become = ConvTranspose3d
    _transposed = True


class _LazyNorm(LazyModuleMixin):
    def __init__(self, eps: float = 1e-5, momentum=0.1, affine: bool = True, track_running_stats: bool = True,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__(0, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self._lazy_kw = {"device": device, "dtype": dtype}
        _uninitialized(self, ("weight", "bias"), device, dtype)
        self._start_lazy()

    def initialize_parameters(self, input) -> None:
        import kiln  # noqa: PLC0415 - kiln imports nn

        batched = input.dim() != getattr(self, "_spatial", -1) + 1
        self.num_features = input.shape[1] if batched else input.shape[0]
        for name in ("weight", "bias"):
            value = getattr(self, name)
            if value is not None:
                value.materialize((self.num_features,))
        if self.track_running_stats:
            self.running_mean = kiln.zeros(self.num_features, **self._lazy_kw)
            self.running_var = kiln.ones(self.num_features, **self._lazy_kw)
        del self._lazy_kw
        if hasattr(self, "reset_parameters"):  # batch norm: running statistics and affine parameters
            self.reset_parameters()
        elif self.affine:
            with kiln.no_grad():
                self.weight.fill_(1.0)
                self.bias.zero_()


class LazyBatchNorm1d(_LazyNorm, BatchNorm1d):
    cls_to_become = BatchNorm1d


class LazyBatchNorm2d(_LazyNorm, BatchNorm2d):
    cls_to_become = BatchNorm2d


class LazyBatchNorm3d(_LazyNorm, BatchNorm3d):
    cls_to_become = BatchNorm3d


class LazyInstanceNorm1d(_LazyNorm, InstanceNorm1d):
    cls_to_become = InstanceNorm1d

    def __init__(self, eps: float = 1e-5, momentum=0.1, affine: bool = False, track_running_stats: bool = False,
                 device=None, dtype=None) -> None:  # fmt: skip
        super().__init__(eps, momentum, affine, track_running_stats, device, dtype)


class LazyInstanceNorm2d(LazyInstanceNorm1d, InstanceNorm2d):
    cls_to_become = InstanceNorm2d


class LazyInstanceNorm3d(LazyInstanceNorm1d, InstanceNorm3d):
    cls_to_become = InstanceNorm3d
