"""``kiln.utils.tensorboard``: PyTorch's ``SummaryWriter``, writing TensorBoard event files.

Needs the ``tensorboard`` package (``pip install -e ".[tensorboard]"``), as PyTorch's does: its event
file writer and protocol buffers make the files, so TensorBoard and its event readers see exactly
what they would from PyTorch -- scalars (``add_scalar``, ``add_scalars``), histograms
(``add_histogram``), text (``add_text``) and hyperparameters with their metrics (``add_hparams``).

>>> import tempfile, kiln
>>> from kiln.utils.tensorboard import SummaryWriter
>>> with SummaryWriter(tempfile.mkdtemp()) as writer:
...     for step in range(3):
...         writer.add_scalar("loss", 1.0 / (step + 1), step)
"""

from __future__ import annotations

import os
import socket
import time
from datetime import datetime
from typing import Any

import numpy as np

__all__ = ["SummaryWriter"]

_INSTALL = (
    "kiln.utils.tensorboard needs the tensorboard package: pip install tensorboard (or kiln's [tensorboard] extra)"
)


def _tensorboard():
    """The tensorboard modules SummaryWriter builds on, imported on first use with a clear error."""
    try:
        from tensorboard.compat.proto import summary_pb2  # noqa: PLC0415
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # noqa: PLC0415
        from tensorboard.plugins.hparams import summary_v2 as hparams  # noqa: PLC0415
        from tensorboard.plugins.text import summary_v2 as text  # noqa: PLC0415
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: PLC0415
    except ImportError as error:
        raise ModuleNotFoundError(f"{_INSTALL} ({error})") from None
    return summary_pb2, Event, SessionLog, hparams, text, EventFileWriter


def _numpy(value: Any) -> np.ndarray:
    """A tensor's, array's or number's values as a numpy array (reads a kiln tensor's memory)."""
    if hasattr(value, "detach"):
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value)


def _scalar(value: Any, what: str) -> float:
    array = _numpy(value)
    if array.size != 1:
        raise ValueError(f"{what}: expected a number or a one-element tensor, got shape {list(array.shape)}")
    return float(array.reshape(()))


def _tensorflow_edges() -> np.ndarray:
    """TensorFlow's default histogram bucket edges, which PyTorch's ``bins="tensorflow"`` uses: a
    10% geometric series from 1e-12 to 1e20 on each side of 0, and the float64 range at the ends."""
    positive = 1e-12 * 1.1 ** np.arange(int(np.ceil(np.log(1e32) / np.log(1.1))) + 1)
    return np.concatenate([[-np.finfo(np.float64).max], -positive[::-1], [0.0], positive, [np.finfo(np.float64).max]])


def _histogram(summary_pb2, values: Any, bins: Any, max_bins: int | None):
    """A ``HistogramProto`` of ``values``: empty buckets at both ends dropped, as TensorBoard expects."""
    array = _numpy(values).astype(np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError("add_histogram: the values are empty")
    if not np.all(np.isfinite(array)):
        raise ValueError("add_histogram: the values hold nan or inf, which a histogram cannot place")
    edges = _tensorflow_edges() if bins == "tensorflow" else bins
    counts, limits = np.histogram(array, bins=edges)
    if max_bins is not None and len(counts) > max_bins:  # merge neighbours until at most max_bins remain
        group = -(-len(counts) // max_bins)
        pad = (-len(counts)) % group
        counts = np.pad(counts, (0, pad)).reshape(-1, group).sum(axis=1)
        limits = np.concatenate([limits[:-1:group], limits[-1:]])
    # TensorBoard reads bucket i as (bucket_limit[i - 1], bucket_limit[i]]: an empty first bucket whose
    # limit is the left edge of the first non-empty one says where the histogram starts.
    used = np.flatnonzero(counts)
    first, last = used[0], used[-1]
    buckets = np.concatenate([[0], counts[first : last + 1]]).astype(np.float64)
    return summary_pb2.HistogramProto(
        min=float(array.min()), max=float(array.max()), num=int(array.size), sum=float(array.sum()),
        sum_squares=float(np.dot(array, array)), bucket_limit=limits[first : last + 2].tolist(),
        bucket=buckets.tolist(),
    )  # fmt: skip


class SummaryWriter:
    """Writes TensorBoard event files under ``log_dir`` (default ``runs/<date>_<host><comment>``), as
    ``torch.utils.tensorboard.SummaryWriter`` does; ``tensorboard --logdir runs`` shows them.

    ``global_step`` is the x axis; ``walltime`` defaults to now. Events are queued and written every
    ``flush_secs`` seconds, at ``max_queue`` pending events, on ``flush()`` and on ``close()``.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, comment: str = "", purge_step: int | None = None,
                 max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = "") -> None:  # fmt: skip
        modules = _tensorboard()
        self._summary_pb2, self._Event, self._SessionLog, self._hparams, self._text, self._EventFileWriter = modules
        if log_dir is None:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = os.fspath(log_dir)
        self._options = {"max_queue_size": max_queue, "flush_secs": flush_secs, "filename_suffix": filename_suffix}
        self._writer = self._EventFileWriter(self.log_dir, **self._options)
        self._children: dict[str, Any] = {}  # add_scalars' and add_hparams' runs, by folder
        if purge_step is not None:  # TensorBoard drops the events at and after this step from earlier runs
            start = self._SessionLog(status=self._SessionLog.START)
            self._writer.add_event(self._Event(step=purge_step, file_version="brain.Event:2"))
            self._writer.add_event(self._Event(step=purge_step, session_log=start))

    # ------------------------------------------------------------------ writing
    def _write(self, summary, global_step: int | None, walltime: float | None, writer=None) -> None:
        event = self._Event(summary=summary, wall_time=time.time() if walltime is None else walltime)
        if global_step is not None:
            event.step = int(global_step)
        (writer or self._writer).add_event(event)

    def _child(self, folder: str):
        writer = self._children.get(folder)
        if writer is None:
            writer = self._children[folder] = self._EventFileWriter(folder, **self._options)
        return writer

    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = None, walltime: float | None = None,
                   new_style: bool = False, double_precision: bool = False) -> None:  # fmt: skip
        """One point of the curve ``tag``: a number or a one-element tensor (its value is read)."""
        value = self._summary_pb2.Summary.Value(tag=tag, simple_value=_scalar(scalar_value, "add_scalar"))
        self._write(self._summary_pb2.Summary(value=[value]), global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict[str, Any], global_step: int | None = None,
                    walltime: float | None = None) -> None:  # fmt: skip
        """Several curves on one chart: each ``tag`` goes to the run ``<log_dir>/<main_tag>_<tag>``, as PyTorch."""
        walltime = time.time() if walltime is None else walltime
        for tag, scalar in tag_scalar_dict.items():
            folder = os.path.join(self.log_dir, f"{main_tag.replace('/', '_')}_{tag}")
            value = self._summary_pb2.Summary.Value(tag=main_tag, simple_value=_scalar(scalar, "add_scalars"))
            self._write(self._summary_pb2.Summary(value=[value]), global_step, walltime, self._child(folder))

    def add_histogram(self, tag: str, values: Any, global_step: int | None = None, bins: Any = "tensorflow",
                      walltime: float | None = None, max_bins: int | None = None) -> None:  # fmt: skip
        """The distribution of ``values`` (a tensor or array); ``bins`` as numpy's ``histogram`` takes
        them, or ``"tensorflow"`` (the default): TensorFlow's exponential buckets."""
        histogram = _histogram(self._summary_pb2, values, bins, max_bins)
        value = self._summary_pb2.Summary.Value(tag=tag, histo=histogram)
        self._write(self._summary_pb2.Summary(value=[value]), global_step, walltime)

    def add_text(self, tag: str, text_string: str, global_step: int | None = None,
                 walltime: float | None = None) -> None:  # fmt: skip
        """Markdown text under ``tag`` (TensorBoard's Text tab; stored as ``<tag>/text_summary``, as PyTorch)."""
        self._write(self._text.text_pb(f"{tag}/text_summary", text_string), global_step, walltime)

    def add_hparams(self, hparam_dict: dict[str, Any], metric_dict: dict[str, Any],
                    hparam_domain_discrete: dict[str, list] | None = None, run_name: str | None = None,
                    global_step: int | None = None) -> None:  # fmt: skip
        """One trial of a hyperparameter search: its hyperparameters (numbers, strings, bools) and the
        metrics it reached, in the run ``<log_dir>/<run_name or the time>`` (TensorBoard's HParams tab)."""
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError("add_hparams: hparam_dict and metric_dict must be dicts")
        hparams = {}
        for name, value in hparam_dict.items():
            if hasattr(value, "detach") or isinstance(value, np.ndarray):
                value = _scalar(value, f"add_hparams: hparam {name!r}")
            if value is not None and not isinstance(value, bool | int | float | str):
                raise TypeError(f"add_hparams: hparam {name!r} must be a number, string or bool, got "
                                f"{type(value).__name__}")  # fmt: skip
            hparams[name] = value
        folder = os.path.join(self.log_dir, run_name or str(time.time()))
        writer = self._child(folder)
        metrics = [self._hparams.Metric(name) for name in metric_dict]
        self._write(self._hparams.hparams_config_pb(self._domains(hparams, hparam_domain_discrete), metrics),
                    None, None, writer)  # fmt: skip
        self._write(self._hparams.hparams_pb(hparams, trial_id=os.path.basename(folder)), None, None, writer)
        for name, value in metric_dict.items():
            metric = self._summary_pb2.Summary.Value(tag=name, simple_value=_scalar(value, f"add_hparams: {name!r}"))
            self._write(self._summary_pb2.Summary(value=[metric]), global_step, None, writer)

    def _domains(self, hparams: dict[str, Any], discrete: dict[str, list] | None) -> list:
        """The experiment's hyperparameters, with the values each may take where ``discrete`` names them."""
        out = []
        for name in hparams:
            values = (discrete or {}).get(name)
            out.append(self._hparams.HParam(name, self._hparams.Discrete(values) if values else None))
        return out

    # ------------------------------------------------------------------ lifetime
    def get_logdir(self) -> str:
        return self.log_dir

    def flush(self) -> None:
        self._writer.flush()
        for writer in self._children.values():
            writer.flush()

    def close(self) -> None:
        self._writer.close()
        for writer in self._children.values():
            writer.close()

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
