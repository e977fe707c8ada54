"""Progress: counts and ETA (resumed items excluded), plain throttled lines off a terminal,
a rich bar redrawn in place on one."""

import io

import pytest

from vccc_jax.runs.progress import Progress, format_seconds


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_format_seconds():
    assert format_seconds(None) == "--:--"
    assert format_seconds(65) == "01:05"
    assert format_seconds(3725) == "1:02:05"
    assert format_seconds(float("inf")) == "--:--"


def test_plain_text_lines_and_eta():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(10, done=2, stream=out, clock=clock, tty=False, min_interval=5.0)
    assert "2/10" in out.getvalue() and "eta --:--" in out.getvalue()
    clock.t = 4.0
    p.advance(2)  # 2 cells in 4 s computed this run -> 6 left at 0.5/s = 12 s
    assert p.eta() == pytest.approx(12.0)
    assert out.getvalue().count("\n") == 1  # throttled: < min_interval since last line
    clock.t = 6.0
    p.advance(1, note="g/vccc")
    last = out.getvalue().splitlines()[-1]
    assert "5/10" in last and "g/vccc" in last and "\r" not in out.getvalue()
    clock.t = 20.0
    p.advance(5)  # the final count is always printed
    assert "10/10" in out.getvalue().splitlines()[-1] and "100.0%" in out.getvalue()
    n = out.getvalue().count("\n")
    p.close()
    assert out.getvalue().count("\n") == n  # nothing new to say


def test_tty_bar_redraws_in_place():
    out = io.StringIO()
    with Progress(3, stream=out, clock=FakeClock(), tty=True) as p:
        p.advance(1, note="g/x")
        p.advance(2)
    text = out.getvalue()
    assert text.count("\r") >= 3 and "3/3" in text and "g/x" in text
    assert text.rstrip("\x1b[?25h").endswith("\n")  # the finished bar stays on its own line


def test_bad_counts_raise():
    with pytest.raises(ValueError, match="done"):
        Progress(3, done=4, stream=io.StringIO())
