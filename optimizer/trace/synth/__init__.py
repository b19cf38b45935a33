"""Synthetic request traces: chat, rag, agent and short workloads with chained block hashes.

See ``docs/workloads.md`` for what each kind models, its knobs and its measured reuse.
"""

from __future__ import annotations

from optimizer.trace.synth.arrivals import PROCESSES, arrival_times
from optimizer.trace.synth.core import synthesize
from optimizer.trace.synth.knobs import KNOBS, AgentKnobs, ChatKnobs, RagKnobs, ShortKnobs

KINDS = tuple(KNOBS)

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
