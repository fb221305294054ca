"""Grad mode: whether ops record the autograd graph. Thread-local, as in PyTorch."""

from __future__ import annotations

import functools
import threading


class _State(threading.local):
    grad_enabled = True
    inference = False
    anomaly = False

    def __setattr__(self, name: str, value) -> None:
        if name == "grad_enabled" and bool(value) != bool(self.grad_enabled):
            global threads_without_grad
            with _count_lock:  # (+= on a global is no atomic step: threads could lose an update)
                threads_without_grad += -1 if value else 1
        super().__setattr__(name, value)


state = _State()

# How many threads have grad mode off. While none has, grad mode is on in the thread asking, and
# the check each recorded op makes is this module attribute (~4 ns) rather than the thread-local
# state (~35 ns): ``threads_without_grad == 0 or state.grad_enabled``. A thread's own count is in
# place whenever its grad mode is off (it counts itself before it reads), so the check never
# answers on for a thread whose mode is off; a thread that ends with its mode off leaves the count
# up, which costs the faster check and nothing else.
threads_without_grad = 0
_count_lock = threading.Lock()

# Whether any thread has turned inference mode or anomaly mode on since kiln was imported. Until
# one has, both are off everywhere, and the checks that run for every tensor (``make_tensor``) and
# every backward node read these module attributes (~3 ns) rather than the thread-local state (~20 ns).
inference_used = False
anomaly_used = False


def is_grad_enabled() -> bool:
    return state.grad_enabled


def is_inference_mode_enabled() -> bool:
    return state.inference


class _GradModeContext:
    """Base of the grad-mode context managers; each also works as a decorator."""

    def _enter_value(self) -> bool:
        raise NotImplementedError

    def __enter__(self) -> None:
        self._prev = state.grad_enabled
        state.grad_enabled = self._enter_value()

    def __exit__(self, *exc: object) -> None:
        state.grad_enabled = self._prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)

        return wrapper

    def _args(self) -> tuple:
        return ()


class no_grad(_GradModeContext):
    """Ops inside record no graph: ``with kiln.no_grad(): w -= lr * w.grad``."""

    def _enter_value(self) -> bool:
        return False


class enable_grad(_GradModeContext):
    def _enter_value(self) -> bool:
        return True


class set_grad_enabled(_GradModeContext):
    """``set_grad_enabled(False)`` switches grad mode off at once, and restores on exit."""

    def __init__(self, mode: bool) -> None:
        self._mode = bool(mode)
        self._prev = state.grad_enabled
        state.grad_enabled = self._mode

    def _enter_value(self) -> bool:
        return self._mode

    def __enter__(self) -> None:
        pass  # the mode was set (and the previous one saved) at construction

    def _args(self) -> tuple:
        return (self._mode,)

    def __call__(self, fn):
        state.grad_enabled = self._prev  # used as a decorator: the mode applies inside fn only
        return super().__call__(fn)


class inference_mode(_GradModeContext):
    """Like ``no_grad``, and tensors made inside are inference tensors: they cannot be saved for
    backward later (using one in autograd raises an error)."""

    def __init__(self, mode: bool = True) -> None:
        self._mode = bool(mode)

    def _enter_value(self) -> bool:
        return not self._mode and state.grad_enabled

    def __enter__(self) -> None:
        global inference_used
        inference_used = inference_used or self._mode
        self._prev_inference = state.inference
        state.inference = self._mode
        super().__enter__()

    def __exit__(self, *exc: object) -> None:
        state.inference = self._prev_inference
        super().__exit__()

    def _args(self) -> tuple:
        return (self._mode,)
