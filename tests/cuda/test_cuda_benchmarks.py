"""``python -m benchmarks.run --device cuda``: without CUDA every GPU workload reports itself
skipped, saying why (the GPU numbers themselves come from a GPU machine, not from tests)."""

from __future__ import annotations

import pytest

from benchmarks import cuda_bench, run
from kiln.runtime import devices


@pytest.mark.parametrize("name", sorted(run.CUDA_WORKLOADS))
def test_gpu_workloads_skip_cleanly_without_cuda(monkeypatch, name):
    monkeypatch.setattr(devices, "_probe", lambda: (None, "no GPU (test)"))
    function, module = run._load(name)
    assert module is cuda_bench
    (result,) = function(quick=True)
    assert result.timing is None and result.workload == name
    assert "no CUDA device" in result.note and "kiln[cuda13]" in result.note


def test_device_flag_selects_the_gpu_workloads():
    args = run._parser().parse_args(["--device", "cuda", "cuda_kernels"])
    assert args.device == "cuda" and "--device" in run._flags(args)
    with pytest.raises(SystemExit):
        run.main(["--device", "cuda", "gelu"])  # a CPU workload is not a GPU one
