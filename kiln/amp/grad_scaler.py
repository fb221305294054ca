"""``kiln.amp.GradScaler``: loss scaling for low-precision training, as ``torch.amp.GradScaler``.

The loss is multiplied by a scale before ``backward`` so that small float16 gradients do not flush to
zero; ``step`` divides the gradients by the scale again (``unscale_``) and skips the optimizer step when
any of them is inf or nan; ``update`` halves the scale after such a step and doubles it after
``growth_interval`` steps in a row without one.

>>> import kiln
>>> model = kiln.nn.Linear(3, 1)
>>> opt = kiln.optim.SGD(model.parameters(), lr=0.1)
>>> scaler = kiln.amp.GradScaler("cpu", init_scale=1024.0)
>>> loss = model(kiln.ones(2, 3)).sum()
>>> scaler.scale(loss).backward()
>>> scaler.step(opt)
>>> scaler.update()
>>> scaler.get_scale()
1024.0
"""

from __future__ import annotations

import enum
import warnings
from typing import Any

import kiln

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class GradScaler:
    """See the module docstring. ``device``: "cpu" or "cuda" (on a machine without CUDA a "cuda" scaler
    disables itself with a warning, as PyTorch's does)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:  # fmt: skip
        self._device = device
        self._enabled = enabled
        if enabled and device == "cuda" and not kiln.cuda.is_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available. Disabling.", stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._scale: float | None = None  # set on the first scale(), as in PyTorch
        self._growth_tracker = 0
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ scaling
    def scale(self, outputs):
        """``outputs`` (a tensor, or nested lists/tuples of them) multiplied by the current scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = _float32(self._init_scale)
        if isinstance(outputs, kiln.Tensor):
            return outputs * kiln.tensor(self._scale, dtype=kiln.float32, device=outputs.device)
        if isinstance(outputs, list | tuple):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": OptState.READY, "found_inf": False})

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and note whether any is inf or nan."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._state(optimizer)
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = float(kiln.tensor(self._scale, dtype=kiln.float64).reciprocal().float())  # torch's rounding
        found_inf = False
        with kiln.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.dtype is kiln.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    found_inf = found_inf or not bool(kiln.isfinite(p.grad).all())
                    p.grad.mul_(inv_scale)
        state["found_inf"] = found_inf
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` unless the unscaled gradients hold inf or nan (then skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._state(optimizer)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return result

    def update(self, new_scale=None) -> None:
        """Back off after a skipped step, grow after ``growth_interval`` good ones, or set ``new_scale``."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        assert self._scale is not None  # the check above raises before the first scale()
        if new_scale is not None:
            if isinstance(new_scale, kiln.Tensor):
                if new_scale.numel() != 1 or not new_scale.is_floating_point():
                    raise ValueError("new_scale should be a float or a 1-element floating-point tensor.")
                new_scale = new_scale.item()
            self._scale = float(new_scale)
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values() if s["stage"] is not OptState.READY]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale = _float32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale = _float32(self._scale * self._growth_factor)
                    self._growth_tracker = 0
        self._per_optimizer.clear()

    def _check_scale_growth_tracker(self, name: str) -> None:
        if self._scale is None:
            raise RuntimeError(f"Attempted {name} but the scale is not initialized: call scale() first "
                               "(this may indicate a bug in the training loop).")  # fmt: skip

    # ------------------------------------------------------------------ settings and state
    def get_scale(self) -> float:
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")  # fmt: skip
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = self._init_scale
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


def _float32(value: float) -> float:
    """PyTorch keeps the scale in a float32 tensor: round as it does."""
    return float(kiln.tensor(value, dtype=kiln.float32).item())
