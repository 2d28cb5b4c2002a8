"""runs.summaries.Progress: "auto" is a bar on a terminal only; off one, plain lines every few seconds."""
import io

import pytest

from outer_trainers.runs import summaries
from outer_trainers.runs.summaries import Progress, resolve_progress_mode


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere():
    assert resolve_progress_mode("auto", _Stream(True)) == "bar"
    assert resolve_progress_mode("auto", _Stream(False)) == "log"
    assert resolve_progress_mode("auto", object()) == "log"  # a stream that cannot tell
    assert resolve_progress_mode("bar", _Stream(False)) == "bar"  # asked for explicitly
    with pytest.raises(ValueError, match="progress mode must be one of"):
        resolve_progress_mode("verbose")


def test_log_lines_come_by_time_not_by_step(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(summaries.time, "perf_counter", lambda: now[0])
    bar = Progress("log", total=1000, interval_s=5.0)
    for step in range(1, 1001):
        now[0] += 0.01  # 100 steps per second, metrics every step: 10 s in all
        bar.update(1, {"meta_loss": 1.0 / step})
    lines = capsys.readouterr().err.splitlines()
    # the first logged step, one line per 5 s, and the last step: not a line per step, no carriage returns
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert len(steps) == 3 and steps[0] == 1 and 500 <= steps[1] <= 502 and steps[2] == 1000
    assert all("\r" not in line for line in lines)
    assert "meta_loss=0.001" in lines[-1] and "eta=0s" in lines[-1]


def test_a_silent_stretch_still_gets_a_line_with_the_last_metrics(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(summaries.time, "perf_counter", lambda: now[0])
    bar = Progress("log", total=10, interval_s=5.0)
    now[0] = 6.0
    bar.update(3)  # no metrics logged yet, but 6 s have passed
    bar.update(1, {"meta_loss": 0.5})
    now[0] = 12.0
    bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["step 3/10 eta=14s", "step 5/10 meta_loss=0.5 eta=12s"]
