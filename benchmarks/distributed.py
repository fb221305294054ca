"""Data-parallel training steps: time per step with 1 and 2 processes, and how much of the
gradient all-reduce hides behind the backward.

Workloads (``benchmarks/models.py``), each process holding a per-process batch (weak scaling: 2
processes train on twice the data per step), Adam, one thread per process:

- MLP 784-512-512-10, 64 rows per process (0.67 M parameters, 2.7 MB of gradients);
- GPT (vocabulary 512, d 256, 4 heads, 2 blocks), 2 sequences of 64 tokens per process.

Per process count, rank 0 reports the median of:
- ``step``: a DDP step (forward, backward with bucketed asynchronous all-reduce, Adam);
- ``compute``: the same step under ``no_sync()`` (no communication);
- ``all-reduce``: the same buckets' all-reduces alone, blocking, one after the other.
The share of the all-reduce hidden behind the backward is ``1 - (waited - skew) / all-reduce``
(clipped to [0, 1]): ``waited`` is the time a step spent blocked in ``Work.wait``, which also counts
waiting for a slower peer to finish its backward; ``skew`` estimates that part as the time a barrier
right after a ``no_sync`` step waits. Run: ``python -m benchmarks.distributed [--quick]
[--bucket-cap-mb MB]`` (it starts the workers through ``python -m kiln.distributed.run``). Timings from a shared machine
are noisy; the ratios within one run are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

WORKLOADS = ("mlp", "gpt")


def _batch(name: str, rng, kiln, models):
    """The model and this process's batch."""
    kiln.manual_seed(0)
    if name == "mlp":
        x, y = rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
        return models.mlp(kiln), kiln.from_numpy(x), kiln.from_numpy(y)
    model = models.gpt(kiln, vocab=512, d=256, heads=4, layers=2, context=64)
    return model, kiln.from_numpy(rng.integers(0, 512, (2, 64))), kiln.from_numpy(rng.integers(0, 512, (2, 64)))


def _measure(name: str, rng, repeats: int, bucket_cap_mb: float) -> dict:
    import kiln  # noqa: PLC0415 - the parent process only launches
    import kiln.distributed as dist  # noqa: PLC0415
    from kiln.distributed.collectives import Work  # noqa: PLC0415

    from . import models  # noqa: PLC0415

    model, x, y = _batch(name, rng, kiln, models)
    ddp = kiln.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    opt = kiln.optim.Adam(ddp.parameters(), lr=1e-3)
    flats = [kiln.zeros(sum(p.numel() for p in b.params)) for b in ddp._buckets]

    def step():
        opt.zero_grad()
        logits = ddp(x)
        kiln.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        opt.step()

    def compute():
        with ddp.no_sync():
            step()

    def all_reduce():
        for flat in flats:
            dist.all_reduce(flat, op=dist.ReduceOp.AVG)

    # Time spent blocked in Work.wait during DDP steps: the all-reduce the backward did not hide.
    waited = [0.0]
    plain_wait = Work.wait

    def timed_wait(self, timeout=None):
        start = time.perf_counter()
        try:
            return plain_wait(self, timeout)
        finally:
            waited[0] += time.perf_counter() - start

    times = {}
    skews = []
    for label, fn in (("compute", compute), ("all-reduce", all_reduce), ("step", step)):
        fn()  # warm up (Adam's state, first-touch pages)
        samples = []
        waited[0] = 0.0
        Work.wait = timed_wait if label == "step" else plain_wait
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
            if label == "compute":  # how long this rank waits for the slower one after the same work
                start = time.perf_counter()
                dist.barrier()
                skews.append(time.perf_counter() - start)
        Work.wait = plain_wait
        times[label] = statistics.median(samples)
    times["waited"] = waited[0] / repeats
    times["skew"] = statistics.mean(skews)
    return times | {"buckets": len(ddp._buckets), "params": sum(p.numel() for p in ddp.parameters())}


def _worker(quick: bool, bucket_cap_mb: float) -> None:
    import kiln  # noqa: PLC0415
    import kiln.distributed as dist  # noqa: PLC0415

    kiln.set_num_threads(1)
    dist.init_process_group("mpi")
    rng = np.random.default_rng(dist.get_rank())
    report = {name: _measure(name, rng, 5 if quick else 20, bucket_cap_mb) for name in WORKLOADS}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"world": dist.get_world_size(), **report}), flush=True)
    dist.destroy_process_group()


def run(quick: bool = False, bucket_cap_mb: float = 25) -> list[dict]:
    results = []
    for nproc in (1, 2):
        command = [sys.executable, "-m", "kiln.distributed.run", "--nproc-per-node", str(nproc),
                   "-m", "benchmarks.distributed", "--worker", "--bucket-cap-mb", str(bucket_cap_mb)] + (["--quick"] if quick else [])  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def table(results: list[dict]) -> str:
    rows = ["| workload | processes | step | compute (no_sync) | all-reduce alone | waited in step | peer skew | hidden |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for result in results:
        for name in WORKLOADS:
            t = result[name]
            exposed = max(0.0, t["waited"] - t["skew"])
            hidden = 1.0 - min(1.0, exposed / t["all-reduce"]) if t["all-reduce"] > 0 else float("nan")
            rows.append(f"| {name} ({t['params'] / 1e6:.2f} M params, {t['buckets']} buckets) | {result['world']} | "
                        f"{t['step'] * 1e3:.1f} ms | {t['compute'] * 1e3:.1f} ms | {t['all-reduce'] * 1e3:.2f} ms | "
                        f"{t['waited'] * 1e3:.2f} ms | {t['skew'] * 1e3:.2f} ms | {hidden:.0%} |")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's bucket size (default 25, PyTorch's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        _worker(options.quick, options.bucket_cap_mb)
        return
    print(f"bucket_cap_mb={options.bucket_cap_mb}")
    print(table(run(options.quick, options.bucket_cap_mb)))


if __name__ == "__main__":
    main()
