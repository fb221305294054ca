"""Reverse-mode autograd: a dynamic tape of backward nodes, run by an iterative engine."""

from .anomaly import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .api import backward, grad
from .function import Function, FunctionCtx
from .grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .graph import FreedGraphError, Node

__all__ = [
    "FreedGraphError", "Function", "FunctionCtx", "GradcheckError", "Node", "backward", "detect_anomaly",
    "enable_grad", "grad", "gradcheck", "gradgradcheck", "inference_mode", "is_anomaly_enabled", "is_grad_enabled",
    "is_inference_mode_enabled", "no_grad", "set_detect_anomaly", "set_grad_enabled",
]  # fmt: skip
