"""The user-facing layer: Tensor, the op API, autograd (and, later, the tracer and compile)."""
