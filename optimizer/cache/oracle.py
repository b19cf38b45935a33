"""Write block-id sequences as libCacheSim ``oracleGeneral`` binary traces.

libCacheSim's C simulator (``process_trace``) reads 24-byte little-endian records
``(uint32 time, uint64 obj_id, uint32 obj_size, int64 next_access_vtime)``
(``traceReader/customizedReader/oracle/oracleGeneralBin.h``). kvtier writes one record per
block access with ``obj_size = 1`` so a libCacheSim cache of ``C`` bytes holds ``C`` blocks,
``time = 0`` (no TTL expiry) and ``next_access_vtime = -1`` (unused by the policies compared).
"""

from __future__ import annotations

import os

import numpy as np

from kvtier.files import atomic_write

ORACLE_GENERAL = np.dtype(
    [("time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")]
)


def write_oracle_general(ids: np.ndarray, path: str | os.PathLike[str]) -> None:
    """Write ``ids`` (non-negative integers) as an oracleGeneral file, atomically."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0)):
        raise ValueError("ids must be a 1-D array of non-negative integers")
    rec = np.zeros(len(arr), dtype=ORACLE_GENERAL)
    rec["obj_id"] = arr
    rec["obj_size"] = 1
    rec["next_access_vtime"] = -1
    atomic_write(path, lambda tmp: rec.tofile(tmp))
