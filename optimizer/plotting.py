"""Matplotlib, optional: the PNG plots of ``trace mrc --plot`` and ``report --plot``."""

from __future__ import annotations

from typing import Any

from kvtier.errors import InputError


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or a one-line error saying how to
    install it (matplotlib is the ``plot`` extra, not a core dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "--plot needs matplotlib; install it with: pip install 'kvtier[plot]'"
        ) from None
    return plt
