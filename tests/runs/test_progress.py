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
    clock.t = 30.0
    p.advance(1)  # the first item paid for the compile: a warm-up, no rate yet
    assert p.eta() is None
    clock.t = 34.0
    p.advance(2)  # 2 items in the 4 s after the warm-up -> 5 left at 0.5/s = 10 s
    assert p.eta() == pytest.approx(10.0)  # resumed items and the compile are excluded
    assert out.getvalue().count("\n") == 2  # throttled: < min_interval since last line
    clock.t = 36.0
    p.advance(1, note="g/vccc")
    last = out.getvalue().splitlines()[-1]
    assert "6/10" in last and "g/vccc" in last and "\r" not in out.getvalue()
    clock.t = 50.0
    p.advance(4)  # the final count is always printed
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


def test_eta_leaves_out_reported_compile_time():
    """A runner that knows its compile seconds reports them: the ETA is then compute only,
    from the first item on (a 100 s compile would otherwise predict 10x too long)."""
    clock = FakeClock()
    p = Progress(20, stream=io.StringIO(), clock=clock, tty=False)
    clock.t = 110.0
    p.advance(10, compile_s=100.0)  # 10 items: 100 s compile + 10 s compute
    assert p.eta() == pytest.approx(10.0)
    clock.t = 115.0
    p.advance(5, compile_s=0.0)  # 15 items in 15 s of compute
    assert p.eta() == pytest.approx(5.0)
    clock.t = 160.0
    p.advance(5, compile_s=40.0)  # a new program compiled: still 1 item/s of compute
    assert p.eta() == 0.0 and p.done == 20


def test_show_false_prints_nothing():
    """``--no-progress``: not the first line, not the last one, not a bar."""
    for tty in (False, True, None):
        out = io.StringIO()
        with Progress(3, stream=out, clock=FakeClock(), tty=tty, show=False) as p:
            p.advance(1, note="x")
            p.advance(2)
        assert out.getvalue() == ""
