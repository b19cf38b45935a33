"""Model profiles from a Hugging Face ``config.json`` (``--model PATH/config.json``).

The geometry is read from the config's fields (``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` or ``hidden_size / heads``; MLA: ``kv_lora_rank``,
``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``; MoE:
``n_routed_experts`` / ``num_experts`` / ``num_local_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``, ``first_k_dense_replace``, ``n_shared_experts``), and the parameter
counts are the sum of the weight matrices those fields imply (embeddings, attention, MLP or
experts, router, LM head unless tied; norms and biases are left out, under 0.1 %). The weight
type is FP8 when ``quantization_config.quant_method`` is ``fp8``, else BF16 (an MXFP4
checkpoint such as gpt-oss is read as BF16: its size needs the curated profile). Sliding-window
layers: the count of ``"sliding_attention"`` in ``layer_types`` and ``sliding_window``.

The configs aiconfigurator-core ships (``aiconfigurator_core/model_configs``) are reachable by
their Hugging Face name (``--model meta-llama/Meta-Llama-3.1-8B``), which also becomes the
profile's ``hf_id`` so the measured step-time backend finds its data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.loader import check_sliding_window
from kvtier.hardware.types import MLA, ModelProfile, MoE


def shipped_config(hf_id: str) -> Path | None:
    """The config.json aiconfigurator-core ships for ``org/name`` (None: none, or no package)."""
    if "/" not in hf_id or hf_id.count("/") != 1:
        return None
    try:
        from importlib.util import find_spec

        spec = find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "model_configs"
    path = root / f"{hf_id.replace('/', '--')}_config.json"
    return path if path.is_file() else None


# The largest dimension or count a config may give: far above any real model (vocabularies of
# about 260k, hidden sizes of about 30k), far below where the parameter arithmetic loses
# meaning. And the deepest nesting of objects and arrays read: real configs nest 3 levels.
MAX_DIM = 1 << 24
MAX_DEPTH = 32


def _int(cfg: dict[str, Any], key: str, path: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM:
        raise InputError(
            f"key {key!r}: must be an integer in [1, {MAX_DIM:,}], got {value!r}", path=path
        )
    return value


def _opt(cfg: dict[str, Any], *keys: str, path: str = "") -> int | None:
    """The first of ``keys`` the config gives as a positive integer (None: none does); one
    above :data:`MAX_DIM` is refused, naming the key."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if value > MAX_DIM:
                raise InputError(
                    f"key {key!r}: must be an integer in [1, {MAX_DIM:,}], got {value!r}",
                    path=path,
                )
            return value
    return None


def _nesting(text: str) -> int:
    """How deep ``text``'s JSON objects and arrays nest (brackets inside strings not counted)."""
    import re

    depth = deepest = 0
    for ch in re.sub(r'"(?:\\.|[^"\\])*"', "", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def profile_from_config(path: str | Path, *, hf_id: str = "") -> ModelProfile:
    """A :class:`ModelProfile` from a Hugging Face ``config.json``; bad fields are one-line
    :class:`InputError` naming the file and key."""
    p = Path(path)
    where = str(p)
    try:
        text = p.read_text(encoding="utf-8")
        if _nesting(text) > MAX_DEPTH:
            raise InputError(
                f"nests objects or arrays deeper than {MAX_DEPTH} levels: not a model config",
                path=where,
            )
        cfg = json.loads(text)
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", path=where) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"not a JSON config: {err}", path=where) from None
    if not isinstance(cfg, dict):
        raise InputError("not a JSON object", path=where)
    if isinstance(cfg.get("text_config"), dict):  # multimodal configs nest the language model
        cfg = {**cfg, **cfg["text_config"]}
    layers = _int(cfg, "num_hidden_layers", where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    vocab = _int(cfg, "vocab_size", where)
    inter = _int(cfg, "intermediate_size", where)
    if heads % kv_heads:
        raise InputError(
            f"key 'num_key_value_heads': {kv_heads} does not divide num_attention_heads "
            f"{heads} (each KV head serves a whole group of query heads)",
            path=where,
        )
    head_dim = _opt(cfg, "head_dim", path=where)
    if head_dim is None:
        if hidden % heads:
            raise InputError(
                f"key 'hidden_size': {hidden} is not divisible by num_attention_heads {heads} "
                "(and no head_dim is given)",
                path=where,
            )
        head_dim = hidden // heads

    mla = None
    kv_lora = _opt(cfg, "kv_lora_rank", path=where)
    if kv_lora is not None:
        rope = _int(cfg, "qk_rope_head_dim", where)
        nope = _int(cfg, "qk_nope_head_dim", where)
        v_dim = _int(cfg, "v_head_dim", where)
        mla = MLA(kv_lora, rope)
        head_dim = (nope + rope + v_dim) // 2  # attention FLOPs: mean of the QK and V dims
        q_lora = _opt(cfg, "q_lora_rank", path=where)
        q = (
            hidden * q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        attn = (
            q
            + hidden * (kv_lora + rope)
            + kv_lora * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
        kv_heads = 1  # one latent per token and layer
    else:
        attn = (
            hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
        )

    experts = _opt(cfg, "n_routed_experts", "num_experts", "num_local_experts", path=where)
    moe = None
    dense_mlp = 3 * hidden * inter
    if experts is not None:
        active = _int(cfg, "num_experts_per_tok", where)
        moe_inter = _opt(cfg, "moe_intermediate_size", path=where) or inter
        dense_layers = _opt(cfg, "first_k_dense_replace", path=where) or 0
        moe_layers = layers - dense_layers
        if moe_layers < 0 or active > experts:
            key, what = (
                ("first_k_dense_replace", f"{dense_layers} exceeds num_hidden_layers {layers}")
                if moe_layers < 0
                else ("num_experts_per_tok", f"{active} exceeds the {experts} experts")
            )
            raise InputError(f"key {key!r}: {what}", path=where)
        shared = (_opt(cfg, "n_shared_experts", path=where) or 0) * 3 * hidden * moe_inter
        shared_inter = _opt(cfg, "shared_expert_intermediate_size", path=where)
        if shared_inter:
            shared = 3 * hidden * shared_inter
        expert = 3 * hidden * moe_inter
        expert_params = float(moe_layers * experts * expert)
        moe = MoE(experts, active, expert_params)
        router = hidden * experts
        mlp_total = dense_layers * dense_mlp + moe_layers * (experts * expert + shared + router)
        mlp_active = dense_layers * dense_mlp + moe_layers * (active * expert + shared + router)
    else:
        mlp_total = mlp_active = layers * dense_mlp
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = float(embed + layers * attn + mlp_total)
    active_params = float(embed + layers * attn + mlp_active)
    quant = cfg.get("quantization_config")
    fp8 = isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "fp8"
    name = hf_id.split("/")[-1] if hf_id else str(cfg.get("_name_or_path") or p.parent.name)
    # sliding-window layers (gpt-oss): ``layer_types`` names each layer's attention
    types = cfg.get("layer_types")
    sliding = sum(1 for t in types if t == "sliding_attention") if isinstance(types, list) else 0
    window = int(cfg.get("sliding_window") or 0) if sliding else 0
    model = ModelProfile(
        name=name or p.stem,
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        params=params,
        active_params=active_params,
        weight_dtype_bytes=1.0 if fp8 else 2.0,
        mla=mla,
        source=where,
        hf_id=hf_id or str(cfg.get("_name_or_path") or ""),
        moe=moe,
        hidden=hidden,
        sliding_window=window,
        sliding_window_layers=sliding,
    )
    check_sliding_window(model, where)
    return model
