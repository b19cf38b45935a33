"""``BlockedTrace``: a request trace as flat numpy arrays at one block size.

This is what the simulators consume. Block identities are dense int32 ids ``0..n_blocks-1``,
so the hot loops index arrays instead of hashing. The constructor checks every invariant the
jitted kernels rely on (they do no bounds checks themselves), so a ``BlockedTrace`` that exists
is safe to hand to any kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from kvtier.errors import InputError

if TYPE_CHECKING:
    from kvtier.trace.strata import SampleStrata


@dataclass(frozen=True, eq=False)
class BlockedTrace:
    """Requests with their full-block ids in CSR layout.

    Request ``i`` reads blocks ``block_ids[block_offsets[i]:block_offsets[i + 1]]`` in prompt
    order. Only full ``block_tokens``-token blocks appear (the tail of a prompt is always
    computed), so ``n_blocks_of(i) <= input_tokens[i] // block_tokens``.
    """

    arrival_s: np.ndarray  # float64 (n,), non-decreasing, finite, >= 0
    input_tokens: np.ndarray  # int64 (n,), > 0
    output_tokens: np.ndarray  # int64 (n,), >= 0
    block_offsets: np.ndarray  # int64 (n + 1,), offsets[0] == 0, non-decreasing
    block_ids: np.ndarray  # int32 (block_offsets[-1],), each in [0, n_blocks)
    n_blocks: int  # number of distinct block ids
    block_tokens: int  # B, tokens per block
    session_id: np.ndarray | None = None  # int64 (n,) or None
    tenant_id: np.ndarray | None = None  # int32 (n,) dense tenant index, or None
    pass_index: np.ndarray | None = None  # int32 (n,) replay pass (synthetic multi-pass traces)
    source: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    sample_fraction: float = 1.0  # of the full trace's sessions / prefix trees (trace sample)
    # a sample's full-trace prompt-length strata: its replays weight latencies by them
    sample_strata: SampleStrata | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        checks = {
            "arrival_s": (self.arrival_s, np.float64, n),
            "input_tokens": (self.input_tokens, np.int64, n),
            "output_tokens": (self.output_tokens, np.int64, n),
            "block_offsets": (self.block_offsets, np.int64, n + 1),
        }
        for name, (arr, dtype, length) in checks.items():
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 1:
                raise ValueError(f"BlockedTrace.{name} must be a 1-D {np.dtype(dtype)} array")
            if len(arr) != length:
                raise ValueError(f"BlockedTrace.{name} has length {len(arr)}, expected {length}")
            if not arr.flags.c_contiguous:
                raise ValueError(f"BlockedTrace.{name} must be C-contiguous")
        ids = self.block_ids
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int32 or ids.ndim != 1:
            raise ValueError("BlockedTrace.block_ids must be a 1-D int32 array")
        if not ids.flags.c_contiguous:
            raise ValueError("BlockedTrace.block_ids must be C-contiguous")
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {self.block_tokens}")
        if self.n_blocks < 0:
            raise ValueError(f"n_blocks must be >= 0, got {self.n_blocks}")
        off = self.block_offsets
        if off[0] != 0 or off[-1] != len(ids) or np.any(np.diff(off) < 0):
            raise ValueError("block_offsets must start at 0, end at len(block_ids), not decrease")
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_blocks):
            raise ValueError(f"block_ids must lie in [0, {self.n_blocks})")
        if n:
            if not np.all(np.isfinite(self.arrival_s)) or self.arrival_s.min() < 0:
                raise ValueError("arrival_s must be finite and >= 0")
            if np.any(np.diff(self.arrival_s) < 0):
                raise ValueError("arrival_s must be sorted")
            if self.input_tokens.min() <= 0 or self.output_tokens.min() < 0:
                raise ValueError("input_tokens must be > 0 and output_tokens >= 0")
            if np.any(np.diff(off) > self.input_tokens // self.block_tokens):
                raise ValueError("a request has more blocks than full blocks in its prompt")
        for name in ("session_id", "tenant_id", "pass_index"):
            arr = getattr(self, name)
            if arr is not None and (not isinstance(arr, np.ndarray) or len(arr) != n):
                raise ValueError(f"BlockedTrace.{name} must be an array of length {n}")
        if self.tenant_id is not None and (
            self.tenant_id.dtype != np.int32 or (n and self.tenant_id.min() < 0)
        ):
            raise ValueError("BlockedTrace.tenant_id must be int32 and >= 0")

    @property
    def n_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def blocks_per_request(self) -> np.ndarray:
        """Number of full blocks of each request (int64)."""
        return np.diff(self.block_offsets)

    @property
    def n_block_refs(self) -> int:
        return int(self.block_offsets[-1])

    @cached_property
    def shared_blocks(self) -> tuple[np.ndarray, int]:
        """``(shared, n_shared)``: per block reference, the block's dense number among the
        blocks referenced more than once (-1 for a block referenced once), and their count.

        Computed once per trace and kept (a frozen trace's arrays are not to be changed): the
        serving kernel's prefix-cache map is indexed by it; see :mod:`kvtier.trace.shared`.
        """
        from kvtier.trace.shared import shared_block_index  # numba: only when replaying

        return shared_block_index(self.block_ids, self.n_blocks)

    def with_arrivals(self, arrival_s: np.ndarray) -> BlockedTrace:
        """The same requests arriving at ``arrival_s`` (e.g. a trace replayed faster).

        ``shared_blocks`` depends on the blocks alone, so a computed one is carried over
        rather than computed again for every rescaled copy (the optimizer's capacity search
        replays one trace at many rates).
        """
        out = replace(self, arrival_s=arrival_s)
        if "shared_blocks" in self.__dict__:
            out.__dict__["shared_blocks"] = self.__dict__["shared_blocks"]
        return out

    def request_blocks(self, i: int) -> np.ndarray:
        """Block ids of request ``i`` in prompt order (a view)."""
        return self.block_ids[self.block_offsets[i] : self.block_offsets[i + 1]]

    def head(self, n: int) -> BlockedTrace:
        """The first ``n`` requests, with ids left as they are.

        The id space shrinks to the largest id used plus one: for a trace numbered by first
        appearance (as :func:`kvtier.trace.blocks.block_trace` numbers), exactly the blocks
        of the sample, so per-block state sized by ``n_blocks`` covers the sample only.
        """
        n = max(0, min(n, self.n_requests))
        end = int(self.block_offsets[n])
        ids = np.ascontiguousarray(self.block_ids[:end])

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(a[:n])

        return BlockedTrace(
            arrival_s=np.ascontiguousarray(self.arrival_s[:n]),
            input_tokens=np.ascontiguousarray(self.input_tokens[:n]),
            output_tokens=np.ascontiguousarray(self.output_tokens[:n]),
            block_offsets=np.ascontiguousarray(self.block_offsets[: n + 1]),
            block_ids=ids,
            n_blocks=int(ids.max()) + 1 if len(ids) else 0,
            block_tokens=self.block_tokens,
            session_id=cut(self.session_id),
            tenant_id=cut(self.tenant_id),
            pass_index=cut(self.pass_index),
            source=self.source,
            sample_fraction=self.sample_fraction,
            sample_strata=self.sample_strata,
        )

    @classmethod
    def from_lists(
        cls,
        arrival_s: list[float],
        input_tokens: list[int],
        output_tokens: list[int],
        blocks: list[list[int]],
        block_tokens: int,
        n_blocks: int | None = None,
    ) -> BlockedTrace:
        """Build from Python lists; for tests and small examples."""
        flat = [b for req in blocks for b in req]
        offsets = np.zeros(len(blocks) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(r) for r in blocks])
        ids = np.asarray(flat, dtype=np.int32)
        return cls(
            arrival_s=np.asarray(arrival_s, dtype=np.float64),
            input_tokens=np.asarray(input_tokens, dtype=np.int64),
            output_tokens=np.asarray(output_tokens, dtype=np.int64),
            block_offsets=offsets,
            block_ids=ids,
            n_blocks=int(n_blocks if n_blocks is not None else (ids.max() + 1 if len(ids) else 0)),
            block_tokens=block_tokens,
        )


def check_block_size(block_tokens: int, native: int, path: str | None) -> int:
    """``block_tokens`` if it is a multiple or a divisor of the trace's ``native`` block size
    (the rule of :func:`~kvtier.trace.blocks.block_trace` and of the streamed mapping)."""
    B = int(block_tokens)
    if B <= 0 or (B % native and native % B):
        raise InputError(
            f"block size {B} must be a multiple or a divisor of the trace's native block size "
            f"{native}",
            path=path,
            column="block_tokens",
        )
    return B
