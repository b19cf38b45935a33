"""How a replay's energy reads in tables (:mod:`kvtier.sim.energy` computes it)."""

from __future__ import annotations

import math
from typing import Any

TOK_PER_J = ("tok/J", "tokens_per_joule", "{:.2f}")  # a table column beside cost


def _num(fmt: str, value: Any) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return fmt.format(value)


def energy_cell(m: Any) -> str:
    """Tokens per joule, joules per token and the mean power of metrics ``m`` in one cell
    (``-`` for a figure without a value, as when nothing was served)."""
    return (
        f"{_num('{:.2f}', m.tokens_per_joule)} tok/J, {_num('{:.3f}', m.joules_per_token)} J "
        f"per token, {_num('{:,.1f}', None if m.power_w is None else m.power_w / 1e3)} kW mean "
        "(PUE included)"
    )
