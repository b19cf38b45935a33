"""Progress a person can see: a live bar or status on a terminal; elsewhere (a pipe, a file, a
CI log) one line on stderr at least every :data:`PROGRESS_S` seconds; ``--quiet`` neither.

A line is written by a thread on a timer, not when work happens, so it comes however long a
trial or a batch takes (a first trial compiles the simulator for a minute or more). The
interval is ``$KVTIER_PROGRESS_S`` (seconds > 0) when set.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from kvtier.errors import InputError

PROGRESS_ENV = "KVTIER_PROGRESS_S"
PROGRESS_S = 10.0


def progress_seconds() -> float:
    """Seconds between progress lines: :data:`PROGRESS_S`, or ``$KVTIER_PROGRESS_S``."""
    raw = os.environ.get(PROGRESS_ENV, "").strip()
    if not raw:
        return PROGRESS_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"${PROGRESS_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Ticker:
    """Writes ``label: text()`` to stderr (or hands it to ``emit``) every ``interval``
    seconds until stopped.

    ``text`` is called on the ticker's thread; it must only read state that the working
    thread updates.
    """

    def __init__(
        self,
        label: str,
        text: Callable[[], str],
        interval: float,
        *,
        emit: Callable[[str], Any] | None = None,
    ) -> None:
        self.label, self.text, self.interval = label, text, interval
        self.emit = emit or (lambda line: click.echo(line, err=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                line = f"{self.label}: {self.text()}"
            except Exception as err:  # noqa: BLE001 - a progress line never stops the work
                line = f"{self.label}: (progress unavailable: {err})"
            self.emit(line)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


class TrialProgress:
    """What an optimize run has done, as the ``on_trial`` hook learns it, and its line.

    ``done`` counts the study's finished trials (a resumed study starts above 0); the rate
    behind the ETA counts only those this run finished.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.done = 0
        self.first_done: int | None = None  # the study's count when this run's first trial ended
        self.best: Any = None
        self.finished = 0
        self.feasible = 0

    def update(self, done: int, best: Any, tally: Any = None) -> None:
        if self.first_done is None:
            self.first_done = done - 1
        self.done, self.best = done, best
        if tally is not None:
            self.finished, self.feasible = tally.finished, tally.feasible

    def best_text(self) -> str:
        if self.best is None:
            return "no feasible trial yet"
        return f"best ${self.best.metrics['cost_per_mtok']:.4f}/Mtok (trial {self.best.number})"

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        parts = [f"{self.done}/{self.total} trials"]
        if self.first_done is None:
            parts.append(
                "no trial has ended in this run yet (the first run on a machine compiles the "
                "simulator: a minute or more)"
            )
        else:
            parts.append(self.best_text())
            if self.finished:
                parts.append(
                    f"{self.feasible}/{self.finished} meet the SLO "
                    f"({self.feasible / self.finished:.0%})"
                )
        parts.append(f"{duration(elapsed)} elapsed")
        ran = self.done - (self.first_done or 0)
        left = max(0, self.total - self.done)
        if self.first_done is not None and ran > 0 and left > 0:
            parts.append(f"ETA {duration(elapsed / ran * left)}")
        return ", ".join(parts)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} GB"  # pragma: no cover - the loop returns


def meter_line(meter: Any, elapsed: float) -> str:
    """``1,234,567 rows, 45.6 MB, 123,456 rows/s, 4.6 MB/s, 10 s elapsed`` (and the stage)."""
    rate = max(elapsed, 1e-9)
    parts = [
        f"{meter.rows:,} rows",
        _size(meter.nbytes),
        f"{meter.rows / rate:,.0f} rows/s",
        f"{_size(meter.nbytes / rate)}/s",
        f"{duration(elapsed)} elapsed",
    ]
    if meter.stage:
        parts.insert(0, meter.stage)
    return ", ".join(parts)


@contextmanager
def stream_progress(label: str, *, quiet: bool, console: Any) -> Iterator[Any]:
    """Meter a streamed trace command (``kvtier.trace.progress``) and show its progress: a
    status line on a terminal, a line every :func:`progress_seconds` on stderr elsewhere."""
    from kvtier.trace.progress import Meter, metering

    meter = Meter()
    started = time.monotonic()
    with metering(meter):
        if quiet:
            yield meter
            return
        text = lambda: meter_line(meter, time.monotonic() - started)  # noqa: E731
        if console.is_terminal:
            with (
                console.status(f"{label}: starting") as status,
                Ticker(label, text, 0.5, emit=status.update),
            ):
                yield meter
            return
        with Ticker(label, text, progress_seconds()):
            yield meter
