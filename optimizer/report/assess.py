"""``kvtier assess``'s report (:mod:`kvtier.experiments.assess`): a Markdown file with one
PNG plot per question beside it, every file written atomically."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from kvtier.files import atomic_write
from kvtier.plotting import pyplot


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def plot_section(plot: dict[str, Any], title: str, path: str | os.PathLike[str]) -> bool:
    """One section's plot as a PNG (lines over x, or grouped bars); False when it has none."""
    if not plot or not plot.get("series"):
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        x = plot["x"]
        series = plot["series"]
        if plot["kind"] == "lines":
            for name, ys in series.items():
                ax.plot(x, [_num(y) for y in ys], marker=".", label=name)
            for v in plot.get("vlines", []):
                ax.axvline(v, color="grey", ls=":", lw=1)
        else:
            n = len(series)
            width = 0.8 / max(n, 1)
            for j, (name, ys) in enumerate(series.items()):
                pos = [i + (j - (n - 1) / 2) * width for i in range(len(x))]
                ax.bar(pos, [_num(y) for y in ys], width, label=name)
            ax.set_xticks(range(len(x)), [str(v) for v in x], rotation=20 if len(x) > 4 else 0)
        ax.set_xlabel(plot.get("xlabel", ""))
        ax.set_ylabel(plot.get("ylabel", ""))
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
    return True


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_assessment(result: Any, out: str | os.PathLike[str]) -> Path:
    """``out/assess.md`` and ``out/NN-key.png`` per section; returns the Markdown's path."""
    folder = Path(out)
    parts = [
        f"# kvtier assess: {Path(str(result.trace)).name}",
        "",
        f"Hardware `{result.hardware}`, model `{result.model}`, tiers `{result.policy}`, "
        f"{result.requests:,} requests replayed.",
        "",
    ]
    for j, s in enumerate(result.sections, start=1):
        png = f"{j:02d}-{s.key}.png"
        drawn = plot_section(s.plot, s.title, folder / png)
        parts += [f"## {s.title}", "", f"**{s.headline}**", "", _md_table(s.headers, s.rows), ""]
        parts += [f"_{n}_" for n in s.notes] + ([""] if s.notes else [])
        if drawn:
            parts += [f"![{s.title}]({png})", ""]
    text = "\n".join(parts)
    md = folder / "assess.md"

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    atomic_write(md, write)
    return md


def is_finite(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))
