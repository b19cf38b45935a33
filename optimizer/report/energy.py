"""How a replay's energy reads in tables (:mod:`kvtier.sim.energy` computes it)."""

from __future__ import annotations

from typing import Any

TOK_PER_J = ("tok/J", "tokens_per_joule", "{:.2f}")  # a table column beside cost


def energy_cell(m: Any) -> str:
    """Tokens per joule, joules per token and the mean power of metrics ``m`` in one cell."""
    return (
        f"{m.tokens_per_joule:.2f} tok/J, {m.joules_per_token:.3f} J per token, "
        f"{m.power_w / 1e3:,.1f} kW mean (PUE included)"
    )
