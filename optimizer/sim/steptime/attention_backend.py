"""SGLang's Triton attention kernels, where the measured tables hold another back end.

``sglang.launch_server --attention-backend triton`` swaps the prefill (extend) and decode
attention kernels for SGLang's own Triton ones. aiconfigurator-core measures SGLang's
attention per GPU under the back end SGLang picks there by default (``flash_attention`` on an
A100, ``fa3`` on Hopper, ``flashinfer`` on an RTX PRO 6000), and its Triton lane mostly at
head shapes the default cannot run. Only one table in aiconfigurator-core 0.12.0 measures
both lanes at a common GQA shape with 128-dimensional heads: SGLang 0.5.14's context
attention on the RTX PRO 6000 Server (``systems/data/rtx_pro_6000_server/attention/sglang/
0.5.14/context_attention_perf.parquet``: 40 query and 8 KV heads, bf16, lanes ``triton`` and
``flashinfer``). There Triton takes 1.5x as long at 1,024 tokens, 2.05x at 4,096 and 2.37x
at 12,288-16,384 (one request; batches of several requests give the same ratio at the same
work). docs/sources.md [AIC-sglang-triton-attention].

The replay scales every prefill-attention time of the measured tables by that ratio at the
request's *equivalent length*: a chunk of ``q`` tokens over a cached prefix of ``c`` does the
causal work of a fresh prompt of ``sqrt(q x (2c + q))`` tokens, and the ratio is read there
(linear in log2 of the length between the measured points, held beyond them). Taking another
GPU's ratio for the scenario's is an assumption (stated in the provenance): kernels of the
FlashAttention-2 family on GPUs without Hopper's warp-group instructions, the RTX PRO 6000's
and the A100's, are its nearest measured case. The decode attention is not scaled: no table
measures both lanes' decode kernels at a common shape.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from pathlib import Path

import numpy as np

from kvtier.errors import InputError
from kvtier.sim.steptime.measured import MeasuredTables

TRITON_LANE = "triton"
COLUMNS = ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim")
COLUMNS += ("attn_dtype", "kv_cache_dtype", "latency")
# the lanes the Triton one is measured against (SGLang's defaults by GPU)
DEFAULT_LANES = ("flashinfer", "fa3", "flash_attention", "trtllm_mha")


@dataclasses.dataclass(frozen=True)
class AttentionRatio:
    """Triton's prefill attention time over the default lane's, by prompt length."""

    lengths: np.ndarray  # tokens of one fresh causal prompt, ascending
    ratio: np.ndarray  # Triton time / default lane time at each length
    source: str  # "system framework version: heads/kv heads, lanes"

    def at(self, length: np.ndarray) -> np.ndarray:
        """The ratio at ``length`` tokens (interpolated in log2, held beyond the ends)."""
        x = np.log2(np.maximum(np.asarray(length, dtype=np.float64), 1.0))
        return np.interp(x, np.log2(self.lengths), self.ratio)


def _attention_tables() -> list[Path]:
    root = Path(str(importlib.resources.files("aiconfigurator_core"))) / "systems" / "data"
    return sorted(root.glob("*/attention/sglang/*/context_attention_perf.parquet"))


def _ratio_in(path: Path, head_dim: int, kv_dtype: str, q_per_kv: float) -> AttentionRatio | None:
    """The one-request ratio in one table, at the shape nearest the model's query heads per KV
    head among those both lanes measured; None when no shape has both."""
    import polars as pl

    kv = "fp8" if kv_dtype == "fp8" else "bfloat16"
    rows = pl.read_parquet(path)
    if not set(COLUMNS) <= set(rows.columns):  # a table of another layout: not read
        return None
    if "window_size" in rows.columns:  # full attention only (older tables measure no windows)
        rows = rows.filter(pl.col("window_size") == 0)
    rows = rows.filter(
        (pl.col("head_dim") == head_dim)
        & (pl.col("attn_dtype") == "bfloat16")
        & (pl.col("kv_cache_dtype") == kv)
        & (pl.col("batch_size") == 1)
    )
    shapes = ["num_heads", "num_key_value_heads"]
    median = rows.group_by([*shapes, "kernel_source", "isl"]).agg(pl.col("latency").median())
    triton = median.filter(pl.col("kernel_source") == TRITON_LANE).drop("kernel_source")
    other = median.filter(pl.col("kernel_source").is_in(DEFAULT_LANES))
    pairs = triton.join(other, on=[*shapes, "isl"], suffix="_default")
    pairs = pairs.filter((pl.col("latency") > 0) & (pl.col("latency_default") > 0))
    if pairs.is_empty():
        return None
    shape = min(
        pairs.select(shapes).unique().rows(),
        key=lambda s: (abs(np.log(s[0] / s[1] / q_per_kv)), -s[0], s[1]),
    )
    one = pairs.filter(
        (pl.col("num_heads") == shape[0]) & (pl.col("num_key_value_heads") == shape[1])
    )
    lane = sorted(one["kernel_source"].unique().to_list())[0]
    one = one.filter(pl.col("kernel_source") == lane).sort("isl")
    system, version = path.parts[-5], path.parts[-2]
    return AttentionRatio(
        lengths=one["isl"].to_numpy().astype(np.float64),
        ratio=(one["latency"] / one["latency_default"]).to_numpy(),
        source=f"{system} sglang {version}: {shape[0]}/{shape[1]} heads, triton over {lane}",
    )


@functools.cache
def triton_ratio(system: str, head_dim: int, kv_dtype: str, q_per_kv: float) -> AttentionRatio:
    """The measured Triton-over-default ratio for a model's head size: the scenario's own GPU
    (aiconfigurator ``system``) first, where its table measures both lanes, else the first
    other table that does."""
    tables = _attention_tables()
    own = [p for p in tables if p.parts[-5] == system]
    for path in own + [p for p in tables if p not in own]:
        found = _ratio_in(path, head_dim, kv_dtype, q_per_kv)
        if found is not None:
            return found
    raise InputError(
        f"no aiconfigurator-core table measures SGLang's Triton attention beside another lane "
        f"at head_dim {head_dim} with {kv_dtype} KV; choices for this model: default",
        option="serving.attention_backend",
    )


def equivalent_length(chunk: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """Tokens of a fresh causal prompt doing the attention work of ``chunk`` new tokens over
    ``prefix`` cached ones: ``chunk x (2 prefix + chunk) / 2`` query-key pairs either way."""
    q = np.asarray(chunk, dtype=np.float64)
    return np.sqrt(q * (2.0 * np.asarray(prefix, dtype=np.float64) + q))


def with_triton_attention(tables: MeasuredTables, ratio: AttentionRatio) -> MeasuredTables:
    """``tables`` with every prefill-attention time (the table stores it less the one-token
    floor) multiplied by ``ratio`` at its equivalent length; the floor by the ratio at one
    token; decode attention and the non-attention time unchanged."""
    lengths = equivalent_length(tables.pq_grid[:, None], tables.pc_grid[None, :])
    floor = tables.pf_floor * float(ratio.at(np.array(1.0)))
    whole = (tables.prefill_attn + tables.pf_floor) * ratio.at(lengths)
    return dataclasses.replace(tables, prefill_attn=np.maximum(whole - floor, 0.0), pf_floor=floor)
