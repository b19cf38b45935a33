"""PNG plot of a hit-ratio curve (``kvtier trace mrc --plot``); matplotlib is optional."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvtier.files import atomic_write
from kvtier.plotting import pyplot

if TYPE_CHECKING:
    from kvtier.cache.mrc import MrcResult


def plot_curve(result: MrcResult, path: str | os.PathLike[str]) -> None:
    """Hit ratio (tokens and blocks) against capacity in blocks, log x axis, written atomically."""
    plt = pyplot()
    caps = [p.capacity_blocks for p in result.points]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(caps, [p.hit_ratio_tokens for p in result.points], marker="o", label="tokens")
    ax.plot(caps, [p.hit_ratio_blocks for p in result.points], marker=".", ls="--", label="blocks")
    if min(caps) > 0:
        ax.set_xscale("log")
    ax.set_xlabel(f"capacity (blocks of {result.block_tokens} tokens)")
    ax.set_ylabel("hit ratio")
    ax.set_ylim(0, 1)
    semantics = "flat" if result.flat else "prefix"
    ax.set_title(f"{result.policy}: {semantics}, {result.method}, warm-up {result.warmup:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
