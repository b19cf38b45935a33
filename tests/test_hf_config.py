"""Model profiles from Hugging Face config.json: the hand-written profiles agree with the
configs aiconfigurator-core ships, a user's config.json loads, and bad ones are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.hardware import load_model
from kvtier.hardware.hf_config import profile_from_config, shipped_config

PAIRS = [
    ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"),
    ("meta-llama/Meta-Llama-3.1-405B", "llama-3.1-405b"),
    ("Qwen/Qwen3-8B", "qwen3-8b"),
    ("Qwen/Qwen3-32B", "qwen3-32b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
]


@pytest.mark.parametrize("hf_id,name", PAIRS)
def test_hand_written_profiles_match_the_configs(hf_id: str, name: str) -> None:
    cfg = load_model(hf_id)
    hand = load_model(name)
    assert cfg.hf_id == hand.hf_id == hf_id
    for field in ("layers", "attention_heads", "kv_heads", "head_dim", "mla"):
        assert getattr(cfg, field) == getattr(hand, field), field
    assert cfg.kv_bytes_per_token() == hand.kv_bytes_per_token()
    assert cfg.weight_dtype_bytes == hand.weight_dtype_bytes
    assert cfg.params == pytest.approx(hand.params, rel=0.01)
    assert cfg.active_params == pytest.approx(hand.active_params, rel=0.03)
    if hand.moe is not None:
        assert cfg.moe is not None
        assert (cfg.moe.experts, cfg.moe.active) == (hand.moe.experts, hand.moe.active)
        assert cfg.moe.expert_params == pytest.approx(hand.moe.expert_params, rel=0.01)
    else:
        assert cfg.moe is None


def test_llama_8b_counts_exactly() -> None:
    """8,030,261,248 parameters: embeddings and LM head (2 x 128256 x 4096), 32 layers of
    attention (4096 x (4096 + 2 x 1024) + 4096 x 4096) and MLP (3 x 4096 x 14336), norms out."""
    m = load_model("meta-llama/Meta-Llama-3.1-8B")
    per_layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert m.params == 2 * 128256 * 4096 + 32 * per_layer
    assert m.hidden_size == 4096


def test_moe_config_qwen3_235b() -> None:
    m = load_model("Qwen/Qwen3-235B-A22B")
    assert m.moe is not None and (m.moe.experts, m.moe.active) == (128, 8)
    assert m.params == pytest.approx(235e9, rel=0.01)
    assert m.active_params == pytest.approx(22e9, rel=0.03)
    assert m.kv_heads == 4 and m.head_dim == 128


def test_user_config_json(tmp_path: Path) -> None:
    src = shipped_config("Qwen/Qwen3-8B")
    assert src is not None
    d = tmp_path / "my-model"
    d.mkdir()
    path = d / "config.json"
    path.write_text(src.read_text())
    m = load_model(str(path))
    assert m.name == "my-model" and m.layers == 36 and m.hf_id == ""
    assert m.params == pytest.approx(load_model("qwen3-8b").params, rel=0.01)


@pytest.mark.parametrize(
    "content,match",
    [
        ("{", "not a JSON config"),
        ("[1]", "not a JSON object"),
        (json.dumps({"hidden_size": 64}), "num_hidden_layers"),
        (
            json.dumps(
                {
                    "num_hidden_layers": 2,
                    "hidden_size": 64,
                    "num_attention_heads": -1,
                    "vocab_size": 10,
                    "intermediate_size": 8,
                }
            ),
            "num_attention_heads",
        ),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputError, match=match) as err:
        profile_from_config(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    trace = Path(__file__).resolve().parent.parent / "traces" / "sample-chat.parquet"
    result = CliRunner().invoke(main, ["replay", "--trace", str(trace), "--model", str(path)])
    assert result.exit_code == 2 and match in result.output and "Traceback" not in result.output


def test_replay_takes_a_config_json(tmp_path: Path) -> None:
    src = shipped_config("meta-llama/Meta-Llama-3.1-8B")
    assert src is not None
    path = tmp_path / "config.json"
    path.write_text(src.read_text())
    trace = Path(__file__).resolve().parent.parent / "traces" / "sample-chat.parquet"
    args = ["replay", "--trace", str(trace), "--model", str(path), "--json"]
    args += ["--set", "serving.step_time=roofline"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["step_time"] == "roofline" and data["n_served"] > 0


def test_gpt_oss_sliding_window_layers_from_the_config() -> None:
    """gpt-oss's layer_types (18 of 36 sliding_attention) and window 128 reach the profile, and
    agree with the curated profile; the MXFP4 size only the curated profile knows."""
    cfg = load_model("openai/gpt-oss-120b")
    hand = load_model("gpt-oss-120b")
    assert (cfg.sliding_window, cfg.sliding_window_layers) == (128, 18)
    assert (hand.sliding_window, hand.sliding_window_layers) == (128, 18)
    for field in ("layers", "attention_heads", "kv_heads", "head_dim", "hidden_size"):
        assert getattr(cfg, field) == getattr(hand, field), field
    assert cfg.kv_bytes_per_token() == hand.kv_bytes_per_token() == 18 * 8 * 64 * 2 * 2
    assert cfg.params == pytest.approx(hand.params, rel=0.01)
    assert cfg.moe is not None and hand.moe is not None
    assert (cfg.moe.experts, cfg.moe.active) == (hand.moe.experts, hand.moe.active) == (128, 4)
    assert cfg.moe.expert_params == pytest.approx(hand.moe.expert_params, rel=0.001)
    assert hand.weight_dtype_bytes < 0.6 < cfg.weight_dtype_bytes  # BF16 from the config
