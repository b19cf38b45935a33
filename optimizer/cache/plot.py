"""PNG plot of a hit-ratio curve (``kvtier trace mrc --plot``): capacity in blocks, or in GB
of KV with ``--model``, on a log axis; matplotlib is optional."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kvtier.files import atomic_write
from kvtier.plotting import pyplot

if TYPE_CHECKING:
    from kvtier.cache.curve import MrcResult


def curve_figure(result: MrcResult, *, block_gb: float | None = None, model: str = "") -> Any:
    """Hit ratio (tokens and blocks) against capacity on a log axis: in GB of KV when
    ``block_gb`` (one block's GB for the model and KV type) is given, else in blocks."""
    plt = pyplot()
    caps = [p.capacity_blocks for p in result.points]
    xs = caps if block_gb is None else [c * block_gb for c in caps]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(xs, [p.hit_ratio_tokens for p in result.points], marker="o", label="tokens")
    ax.plot(xs, [p.hit_ratio_blocks for p in result.points], marker=".", ls="--", label="blocks")
    if min(xs) > 0:
        ax.set_xscale("log")
    if block_gb is None:
        ax.set_xlabel(f"capacity (blocks of {result.block_tokens} tokens)")
    else:
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xlabel(f"capacity (GB of {model} KV, {result.block_tokens}-token blocks)")
    ax.set_ylabel("hit ratio")
    ax.set_ylim(0, 1)
    semantics = "flat" if result.flat else "prefix"
    ax.set_title(f"{result.policy}: {semantics}, {result.method}, warm-up {result.warmup:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_curve(
    result: MrcResult,
    path: str | os.PathLike[str],
    *,
    block_gb: float | None = None,
    model: str = "",
) -> None:
    """The curve (:func:`curve_figure`) as a PNG, written atomically."""
    plt = pyplot()
    fig = curve_figure(result, block_gb=block_gb, model=model)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
