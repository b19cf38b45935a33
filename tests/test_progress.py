"""Progress where no bar can draw: a line on stderr at least every interval, --quiet none."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvtier.cli.progress import (
    PROGRESS_ENV,
    Ticker,
    TrialProgress,
    meter_line,
    progress_seconds,
    stream_progress,
)
from kvtier.trace.progress import Meter, count, stage
from tests.helpers import REPO, assert_one_line_error, invoke

SAMPLE = REPO / "traces" / "sample-chat.parquet"


def test_ticker_writes_a_line_every_interval_whatever_the_work_does() -> None:
    lines: list[tuple[float, str]] = []
    state = {"n": 0}
    with Ticker(
        "job",
        lambda: f"{state['n']} done",
        0.05,
        emit=lambda s: lines.append((time.monotonic(), s)),
    ):
        for _ in range(6):
            time.sleep(0.05)
            state["n"] += 1
    assert len(lines) >= 3
    assert all(text.startswith("job: ") and text.endswith(" done") for _, text in lines)
    gaps = [b - a for (a, _), (b, _) in zip(lines, lines[1:], strict=False)]
    assert max(gaps) < 0.5


def test_trial_line_says_trials_best_feasible_share_and_eta() -> None:
    p = TrialProgress(total=10)
    assert "0/10 trials" in p.line() and "no trial has ended in this run yet" in p.line()
    best = SimpleNamespace(number=2, metrics={"cost_per_mtok": 0.0174})
    # a resumed study: 4 trials were there before; this run finished 2 of its own in 20 s
    p.update(5, None, SimpleNamespace(finished=5, feasible=0))
    p.update(6, best, SimpleNamespace(finished=6, feasible=3))
    line = p.line(now=p.started + 20.0)
    assert "6/10 trials" in line
    assert "best $0.0174/Mtok (trial 2)" in line
    assert "3/6 meet the SLO (50%)" in line
    assert "20 s elapsed" in line
    # 2 trials in 20 s, 4 left: 40 s
    assert "ETA 40 s" in line


def test_meter_line_counts_rows_bytes_and_rates() -> None:
    m = Meter(rows=2_000_000, nbytes=50_000_000, stage="checking and writing rows")
    line = meter_line(m, 10.0)
    assert line.startswith("checking and writing rows, 2,000,000 rows, 50.0 MB")
    assert "200,000 rows/s" in line and "5.0 MB/s" in line and "10 s elapsed" in line


def test_stream_progress_meters_the_readers_and_prints_off_a_terminal(monkeypatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "0.02")
    seen: list[str] = []
    monkeypatch.setattr("click.echo", lambda line, err=False: seen.append(line))
    console = SimpleNamespace(is_terminal=False)
    with stream_progress("trace stats", quiet=False, console=console) as meter:
        for _ in range(5):
            count(1000, 4096)
            stage("reading")
            time.sleep(0.03)
    assert meter.rows == 5000 and meter.nbytes == 5 * 4096
    assert seen and all(s.startswith("trace stats: ") for s in seen)
    assert any("rows/s" in s for s in seen)
    count(1, 1)  # no meter outside the block: nothing is counted, nothing fails
    assert meter.rows == 5000
    seen.clear()
    with stream_progress("trace stats", quiet=True, console=console) as meter:
        count(10, 10)
        time.sleep(0.1)
    assert meter.rows == 10 and seen == []


def test_bad_interval_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "soon")
    with pytest.raises(Exception, match=PROGRESS_ENV):
        progress_seconds()
    r = invoke("trace", "sample", str(SAMPLE), "--fraction", "0.5", "-o", "/tmp/x.parquet")
    assert r.code == 0  # the in-memory path shows no progress and reads no interval
    r = invoke(
        "trace", "sample", str(SAMPLE), "--fraction", "0.5", "-o", "/tmp/x.parquet", "--stream"
    )
    assert_one_line_error(r, PROGRESS_ENV)


@pytest.mark.parametrize("quiet", [False, True])
def test_streamed_sample_prints_progress_unless_quiet(tmp_path, monkeypatch, quiet) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "0.001")
    out = tmp_path / "s.parquet"
    args = ["trace", "sample", str(SAMPLE), "--fraction", "0.5", "-o", str(out), "--stream"]
    r = invoke(*args, *(["--quiet"] if quiet else []))
    assert r.code == 0, r.stderr
    lines = [s for s in r.stderr.splitlines() if s.startswith("trace sample: ")]
    if quiet:
        assert r.stderr == ""
    else:
        assert lines and all("rows/s" in s for s in lines)


def _timed_stderr(proc: subprocess.Popen) -> list[tuple[float, str]]:
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for raw in proc.stderr:
            lines.append((time.monotonic(), raw.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.wait(timeout=900)
    reader.join(timeout=10)
    return lines


@pytest.mark.parametrize("quiet", [False, True])
def test_piped_optimize_prints_a_line_at_least_every_interval(tmp_path: Path, quiet) -> None:
    """``optimize ... | cat``: stdout and stderr are pipes, no terminal; with a 1 s interval
    a progress line comes at least every few seconds for the whole run (a first run compiles
    the simulator for a minute or more, during which no trial ends)."""
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    trace = tmp_path / "chat.parquet"
    write_trace(synthesize("chat", requests=600, rate=6.0, seed=4), trace)
    cmd = [sys.executable, "-m", "kvtier.cli", "optimize", "--trace", str(trace)]
    # enough trials that the run outlasts the interval even with every kernel compiled
    cmd += ["--trials", "40", "--no-presets", "--study", "piped"]
    cmd += ["--storage", f"sqlite:///{tmp_path / 'piped.db'}", "--out", str(tmp_path / "p.toml")]
    cmd += ["--quiet"] if quiet else []
    env = {**os.environ, PROGRESS_ENV: "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
        env=env,
    )
    lines = _timed_stderr(proc)
    ended = time.monotonic()
    assert proc.returncode in (0, 1), "\n".join(s for _, s in lines)
    progress = [(t, s) for t, s in lines if s.startswith("optimize: ")]
    if quiet:
        assert progress == []
        return
    assert ended - started > 3, "too quick a run to test the interval"
    assert progress, "no progress line"
    assert all(" trials" in s and "elapsed" in s for _, s in progress)
    # the first line within a few seconds of the start (imports, reading the trace) and no
    # gap between lines longer than a few intervals (a loaded 2-core machine)
    times = [started, *(t for t, _ in progress)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 15, gaps
    assert ended - times[-1] < 15


def test_batch_off_a_terminal_prints_lines_naming_the_trace(tmp_path, monkeypatch) -> None:
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    monkeypatch.setenv(PROGRESS_ENV, "0.05")
    monkeypatch.chdir(tmp_path)
    traces = []
    for name, seed in (("a", 1), ("b", 2)):
        path = tmp_path / f"{name}.parquet"
        write_trace(synthesize("chat", requests=60, rate=6.0, seed=seed), path)
        traces.append(str(path))
    r = invoke("batch", *traces, "--trials", "2", "--no-presets", "--out-dir", str(tmp_path / "o"))
    assert r.code in (0, 1), r.stderr
    lines = [s for s in r.stderr.splitlines() if s.startswith("batch: ")]
    lines = [s for s in lines if s != "batch: starting"]  # before the first study opens
    assert lines, r.stderr
    assert all(" trials" in s and ("1/2 a.parquet" in s or "2/2 b.parquet" in s) for s in lines)
    q = invoke(
        "batch", *traces, "--trials", "2", "--no-presets", "--out-dir", str(tmp_path / "q"), "-q"
    )
    assert q.code in (0, 1) and not [s for s in q.stderr.splitlines() if s.startswith("batch: ")]


def test_on_a_terminal_the_stream_status_shows_the_count(monkeypatch) -> None:
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    echoed: list[str] = []
    monkeypatch.setattr("click.echo", lambda line, err=False: echoed.append(line))
    with stream_progress("trace map", quiet=False, console=console):
        count(4321, 1000)
        time.sleep(1.2)  # the status is refreshed every 0.5 s
    assert echoed == []  # no lines: the status stands for them
    assert "trace map: 4,321 rows" in buf.getvalue()
