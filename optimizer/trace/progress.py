"""Rows and bytes a streamed trace command has read so far, for its progress lines.

The streamed readers (:func:`kvtier.trace.batches.iter_batches`, the JSON Lines and CSV
imports) count each batch into the :class:`Meter` of the current context, if a command set
one with :func:`metering`; without one, counting costs a context-variable lookup per batch.
The command's progress line (``kvtier.cli.progress``) reads the meter from another thread:
it only reads two integers, so it needs no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Meter:
    """What a streamed command has read: rows (requests or lines) and bytes."""

    rows: int = 0
    nbytes: int = 0
    stage: str = ""  # what the command is doing, when it is more than reading rows

    def add(self, rows: int, nbytes: int) -> None:
        self.rows += int(rows)
        self.nbytes += int(nbytes)


_METER: ContextVar[Meter | None] = ContextVar("kvtier_trace_meter", default=None)


def count(rows: int, nbytes: int) -> None:
    """Count one batch into the current meter, if a command set one."""
    meter = _METER.get()
    if meter is not None:
        meter.add(rows, nbytes)


def stage(text: str) -> None:
    """Say what the command does now (``converting CSV to Parquet``), if a meter is set."""
    meter = _METER.get()
    if meter is not None:
        meter.stage = text


@contextmanager
def metering(meter: Meter) -> Iterator[Meter]:
    """Make ``meter`` the one the streamed readers count into, for the ``with`` block."""
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)
