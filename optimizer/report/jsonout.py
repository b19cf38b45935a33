"""JSON output that is JSON: undefined numbers as ``null``, with the reason said once.

A metric can be undefined (no request served leaves every latency without a sample; a
rejected run has no throughput). Python's ``json`` writes such a float as ``NaN``, which no
strict JSON parser accepts (``jq``, JavaScript's ``JSON.parse``). Every ``--json`` output goes
through :func:`dumps`: non-finite numbers become ``null`` and the caller's reason for them is
returned, for the CLI to print as one warning line on stderr.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(data: Any) -> tuple[Any, list[str]]:
    """``data`` with every NaN or infinite float replaced by None, and the dotted paths of
    the replaced values."""
    replaced: list[str] = []

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            replaced.append(where or "<root>")
            return None
        if isinstance(value, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(data, ""), replaced


def dumps(data: Any, *, indent: int | None = 2) -> tuple[str, list[str]]:
    """Strict JSON text of ``data`` (``allow_nan=False``) and the paths that became null."""
    clean, replaced = finite(data)
    return json.dumps(clean, indent=indent, allow_nan=False), replaced


def null_reason(metrics: dict[str, Any]) -> str | None:
    """Why a replay's metrics have undefined values, in words, or None when none is."""
    served = metrics.get("n_served")
    rejected = metrics.get("n_rejected")
    if served == 0:
        return (
            f"no request was served ({rejected} rejected): latencies, throughput and "
            "per-token cost have no value and are null"
        )
    return None
