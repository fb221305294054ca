"""The programs here are PyTorch scripts that tests/test_ported_programs.py runs as scripts (on torch,
and on kiln with their imports changed); pytest must not import them (they import torch)."""

collect_ignore_glob = ["*.py"]
