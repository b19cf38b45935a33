"""Synthetic request traces: chat, rag, agent and short workloads with chained block hashes.

See ``docs/workloads.md`` for what each kind models, its knobs and its measured reuse.
"""

from __future__ import annotations

from typing import Any

from kvtier.trace.synth.knobs import KNOBS, AgentKnobs, ChatKnobs, RagKnobs, ShortKnobs

KINDS = tuple(KNOBS)

# The generators compile numba kernels; they are imported on first use, so that reading the
# knobs (the CLI builds its options from them) does not import numba.
_LAZY = {
    "PROCESSES": "kvtier.trace.synth.arrivals",
    "arrival_times": "kvtier.trace.synth.arrivals",
    "synthesize": "kvtier.trace.synth.core",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "KINDS",
    "KNOBS",
    "PROCESSES",
    "AgentKnobs",
    "ChatKnobs",
    "RagKnobs",
    "ShortKnobs",
    "arrival_times",
    "synthesize",
]
