"""Request traces: format, validation, import, synthesis, block mapping, statistics."""

from __future__ import annotations

from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import FORMAT_VERSION, Trace

__all__ = ["FORMAT_VERSION", "BlockedTrace", "Trace"]
