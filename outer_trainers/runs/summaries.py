"""Where training metrics go: metrics.jsonl, TensorBoard event files, a progress display.

    log = MetricsLog(output_dir, resume_step=s)   # drops jsonl lines with step > s first
    log.write(step, {"meta_loss": 0.3, ...})      # one JSON line + one TB scalar per number
    log.close()
    bar = Progress(mode, total, initial)          # mode: "auto", "bar" (tqdm), "log" (plain lines), "none"

TensorBoard files are written with tensorboardX (no TensorFlow) under `output_dir/tb`; after a
resume, `purge_step` tells TensorBoard to hide the old run's events past the checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Optional, Sequence

from lopt.file_io import atomic_write_bytes

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


def truncate_jsonl(path: str, max_step: int) -> int:
    """Rewrites a JSON-lines file keeping only the well-formed lines whose "step" is <= `max_step`.

    Atomic: a crash leaves the old or the new file.

    Args:
        path: the file (nothing happens if it does not exist).
        max_step: the last step to keep.

    Returns:
        The number of lines dropped.
    """
    if not os.path.exists(path):
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                dropped += 1
                continue
            if int(rec.get("step", 0)) <= max_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        atomic_write_bytes(path, "".join(kept).encode("utf-8"))
    return dropped


def scalars(metrics: dict) -> dict:
    """The entries of `metrics` that are single real numbers (bools excluded), as floats.

    Args:
        metrics: a step's logged metrics.

    Returns:
        {name: float(value)} of its int and float entries.
    """
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class MetricsLog:
    """Appends each logged step's metrics to `output_dir`/metrics.jsonl and, optionally, TensorBoard.

    Args:
        output_dir: the run's directory (created if needed); None makes every method a no-op.
        resume_step: the step the run (re)starts from (None: 0): metrics.jsonl lines past it, left by a
            killed or earlier run, are dropped first, and TensorBoard hides the old events past it.
        tensorboard: also write TensorBoard event files under `output_dir`/tb (tensorboardX).
        flush_secs: how often TensorBoard flushes its events, in seconds.
    """

    def __init__(self, output_dir: Optional[str], *, resume_step: Optional[int] = None, tensorboard: bool = True,
                 flush_secs: int = 10):
        self.output_dir = output_dir
        self._file = self._tb = None
        if output_dir is None:
            return
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, METRICS_FILE)
        truncate_jsonl(path, resume_step if resume_step is not None else 0)
        self._file = open(path, "a", encoding="utf-8")
        if tensorboard:
            from tensorboardX import SummaryWriter
            purge = None if not resume_step else resume_step + 1
            self._tb = SummaryWriter(logdir=os.path.join(output_dir, TB_DIR), purge_step=purge,
                                     flush_secs=flush_secs)

    def write(self, step: int, metrics: dict) -> None:
        """Writes one JSON line `{**metrics, "step": step}` and one TensorBoard scalar per real number.

        Args:
            step: the step the metrics belong to.
            metrics: {name: value}; JSON-able (non-scalar values appear in metrics.jsonl only).
        """
        if self._file is not None:
            self._file.write(json.dumps(dict(metrics, step=int(step)), allow_nan=True) + "\n")
            self._file.flush()
        if self._tb is not None:
            for tag, value in scalars(metrics).items():
                if tag != "step":
                    self._tb.add_scalar(tag, value, global_step=int(step))

    def close(self) -> None:
        """Closes the files (further writes are dropped)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


OUTER_PROGRESS_FIELDS = (("meta_loss", "meta_loss"), ("inner_steps/s", "inner_steps_per_s"),
                         ("nonfinite", "nonfinite_frac"), ("dropped", "num_dropped_total"))


PROGRESS_MODES = ("auto", "bar", "log", "none")
DEFAULT_LOG_INTERVAL_S = 5.0


def resolve_progress_mode(mode: str, stream=None) -> str:
    """The display a progress `mode` means here: "auto" is "bar" on a terminal and "log" elsewhere.

    A tqdm bar redraws itself with carriage returns, which a terminal shows as one moving line but a
    log file (output piped, as CI and cluster jobs run) keeps as one line holding every redraw; so
    off a terminal "auto" writes plain lines instead.

    Args:
        mode: one of `PROGRESS_MODES`.
        stream: where the display goes (None: `sys.stderr`).

    Returns:
        "bar", "log" or "none".

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode must be one of {PROGRESS_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "bar" if callable(isatty) and isatty() else "log"


class Progress:
    """Progress display of a training loop: a tqdm bar, plain periodic lines, or nothing.

    Args:
        mode: "auto": "bar" when stderr is a terminal, else "log" (`resolve_progress_mode`); "bar": a tqdm
            bar (with ETA); "log": plain lines on stderr (for log files), one when `interval_s` seconds have
            passed since the last line (or the start), one at the first update that brings metrics and one at the last step,
            each with the step, an ETA and the most recent logged metrics; "none": silent.
        total: the step the run trains to.
        initial: the step it starts from.
        desc: the bar's label.
        fields: (label, metric key) pairs of the logged metrics to show, in order; a key absent from
            a step's metrics is left out. The default shows the outer loop's meta-loss, inner steps/s,
            the fraction of non-finite inner steps and the dropped estimates so far.
        interval_s: the "log" mode's seconds between lines (0: a line at every update).
    """

    def __init__(self, mode: str, total: int, initial: int = 0, desc: str = "outer",
                 fields: Sequence[tuple[str, str]] = OUTER_PROGRESS_FIELDS,
                 interval_s: float = DEFAULT_LOG_INTERVAL_S):
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress mode must be 'auto', 'bar', 'log' or 'none', got {mode!r}")
        if not interval_s >= 0:
            raise ValueError(f"interval_s must be >= 0 seconds, got {interval_s}")
        self.mode, self.total, self.n = resolve_progress_mode(mode), total, initial
        self.fields = tuple((str(label), str(key)) for label, key in fields)
        self.interval_s = float(interval_s)
        self._t0, self._n0 = time.perf_counter(), initial
        self._last_line: Optional[float] = None
        self._shown: dict = {}
        self._bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)

    def update(self, n: int = 1, metrics: Optional[dict] = None) -> None:
        """Advances by `n` steps; with `metrics` (a logged step), shows its `fields`.

        Args:
            n: steps taken since the last update.
            metrics: the logged metrics, or None.
        """
        self.n += n
        shown = {label: _fmt(float(metrics[key])) for label, key in self.fields if key in metrics} if metrics else {}
        if self._bar is not None:
            if shown:
                self._bar.set_postfix(shown, refresh=False)
            self._bar.update(n)
        elif self.mode == "log":
            self._shown.update(shown)
            now = time.perf_counter()
            first = self._last_line is None and bool(metrics)
            due = now - (self._t0 if self._last_line is None else self._last_line) >= self.interval_s
            if first or due or self.n >= self.total:
                self._last_line = now
                self._print_line(now)

    def _print_line(self, now: float) -> None:
        done = self.n - self._n0
        rate = done / max(now - self._t0, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        parts = [f"step {self.n}/{self.total}"] + [f"{k}={v}" for k, v in self._shown.items()] + [f"eta={eta:.0f}s"]
        print(" ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        """Closes the tqdm bar (if any)."""
        if self._bar is not None:
            self._bar.close()


def read_event_scalars(logdir: str) -> dict:
    """The scalars of the TensorBoard event files under `logdir`, for tests and quick looks.

    Read with tensorboardX's protobufs (TFRecord framing; CRCs not checked); a record cut short by
    a kill ends its file.

    Args:
        logdir: a directory searched recursively for "tfevents" files.

    Returns:
        {tag: [(step, value), ...]} in file and record order.
    """
    import struct as _struct

    from tensorboardX.proto import event_pb2
    out: dict = {}
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs if "tfevents" in f)
    for path in files:
        with open(path, "rb") as f:
            raw = f.read()
        pos = 0
        while pos + 12 <= len(raw):
            (length,) = _struct.unpack("<Q", raw[pos:pos + 8])
            data = raw[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            if len(data) < length:
                break  # a record cut short by a kill
            event = event_pb2.Event.FromString(data)
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out
