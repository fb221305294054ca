"""Grad mode: whether ops record the autograd graph. Thread-local, as in PyTorch."""

from __future__ import annotations

import functools
import threading


class _State(threading.local):
    grad_enabled = True  # written only by set_mode (see threads_without_grad)
    inference = False
    anomaly = False


# The threads whose grad mode is off. While there are none, grad mode is on in the thread asking,
# and the check each recorded op makes is this module attribute (~5 ns) rather than the thread-local
# state (~35 ns): ``not threads_without_grad or state.grad_enabled``. A thread is in the set whenever
# its mode is off (set_mode adds it before anything reads), so the check never answers on for it; a
# thread that ends with its mode off stays in the set, which costs the slower check and nothing else.
threads_without_grad: set[int] = set()
_get_ident = threading.get_ident


def set_mode(enabled: bool) -> None:
    """Switch this thread's grad mode: every switch goes through here, to keep threads_without_grad
    (set.add and set.discard are single steps: no lock needed)."""
    state.grad_enabled = enabled
    if enabled:
        threads_without_grad.discard(_get_ident())
    else:
        threads_without_grad.add(_get_ident())


state = _State()

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
        set_mode(self._enter_value())

    def __exit__(self, *exc: object) -> None:
        set_mode(self._prev)

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
        set_mode(self._mode)

    def _enter_value(self) -> bool:
        return self._mode

    def __enter__(self) -> None:
        pass  # the mode was set (and the previous one saved) at construction

    def _args(self) -> tuple:
        return (self._mode,)

    def __call__(self, fn):
        set_mode(self._prev)  # used as a decorator: the mode applies inside fn only
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
