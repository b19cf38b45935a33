"""Hardware, GPU and model profiles: KV geometry, loading by name/path, bad files, sources."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvtier.builtin import policies_dir
from kvtier.errors import InputError
from kvtier.hardware import (
    GB,
    builtin_names,
    load_gpu,
    load_hardware,
    load_model,
)
from tests.helpers import REPO

KIB = 1024
GIB = 1024**3

# KiB per token at BF16 from the Hugging Face config.json geometry (docs/sources.md, "Model
# configurations").
KV_KIB = {
    "Llama-3.1-8B": 128,
    "Qwen3-8B": 144,
    "Qwen3-32B": 256,
    "Llama-3.1-70B": 320,
    "Llama-3.1-405B": 504,
}


@pytest.mark.parametrize(("name", "kib"), sorted(KV_KIB.items()))
def test_kv_bytes_per_token_matches_reference_table(name: str, kib: int) -> None:
    assert load_model(name).kv_bytes_per_token() == kib * KIB


def test_mla_geometry_deepseek_v3() -> None:
    model = load_model("DeepSeek-V3")
    # 61 layers x (512 + 64) latent x 2 bytes = 70272 B = 68.625 KiB ("68.6" in docs/sources.md)
    assert model.kv_bytes_per_token() == 61 * 576 * 2
    assert round(model.kv_bytes_per_token() / KIB, 1) == 68.6
    assert model.kv_bytes_per_token("fp8") == 61 * 576


def test_reference_checks_at_128k_context() -> None:
    assert load_model("Llama-3.1-70B").kv_bytes_per_token() * 131072 == 40 * GIB
    assert load_model("Llama-3.1-405B").kv_bytes_per_token() * 131072 == 63 * GIB


def test_kv_dtype_scales_bytes() -> None:
    m = load_model("Llama-3.1-8B")
    assert m.kv_bytes_per_token("fp8") * 2 == m.kv_bytes_per_token("bf16")
    assert m.kv_bytes_per_token("int4") * 4 == m.kv_bytes_per_token("bf16")


def test_every_builtin_profile_loads() -> None:
    assert len(builtin_names("models")) >= 7
    assert {"h20", "h100-sxm", "h200", "b200", "l40s"} <= set(builtin_names("gpus"))
    assert "h100-node" in builtin_names("hardware")
    for name in builtin_names("models"):
        load_model(name)
    for name in builtin_names("gpus"):
        load_gpu(name)
    for name in builtin_names("hardware"):
        hw = load_hardware(name)
        assert hw.topology.max_instances >= 1


def test_engines_size_kv_from_the_runtime_memory_where_it_was_measured() -> None:
    """The CUDA runtime's total (docs/sources.md [GPU-runtime-memory]) is what vLLM, SGLang and
    TensorRT-LLM size their KV budgets from: an A100 80GB's 80 GiB part reports 79.15 GiB, more
    than its data sheet's 80 decimal GB; an H200's "141 GB" reports 139.80 GiB."""
    model = load_model("llama-3.1-8b")
    for name, gib in (("a100-node", 79.15), ("h200-node", 139.80), ("b200-node", 178.35)):
        hw = load_hardware(name)
        assert hw.gpu.engine_hbm_bytes == pytest.approx(gib * 2**30)
        assert hw.kv_capacity_bytes(model) == pytest.approx(
            hw.gpu_memory_utilization * gib * 2**30 - 2e9 - 16.06e9
        )
    a100 = load_hardware("a100-node").gpu
    assert a100.engine_hbm_bytes > a100.hbm_bytes
    # a GPU without a measured figure (Rubin, not shipping) keeps its data sheet's
    rubin = load_gpu("rubin")
    assert rubin.hbm_visible_bytes == 0 and rubin.engine_hbm_bytes == rubin.hbm_bytes


def test_h100_node_numbers() -> None:
    hw = load_hardware("h100-node")
    assert hw.gpu.hbm_bytes == 80 * GB
    assert hw.gpu.peak_flops == 989e12
    assert hw.topology.max_instances == 8
    model = load_model("llama-3.1-8b")  # names are case-insensitive
    # the 79.22 GiB the CUDA runtime reports * 0.9 - 2 GB reserve - 8.03e9 * 2 B of weights
    visible = 79.22 * 2**30
    assert hw.gpu.engine_hbm_bytes == pytest.approx(visible)
    assert hw.kv_capacity_bytes(model) == pytest.approx(0.9 * visible - 2e9 - 16.06e9)
    # TensorRT-LLM: 0.9 of what weights and reserve leave free
    trt = hw.kv_capacity_bytes(model, framework="trtllm")
    assert trt == pytest.approx(0.9 * (visible - 2e9 - 16.06e9))
    # two GPUs: each holds half the weights and its own reserve
    assert hw.kv_capacity_bytes(model, 2, non_kv_bytes=3e9) == pytest.approx(
        2 * (0.9 * visible - 3e9) - 16.06e9
    )
    assert hw.cost_per_hour(8) == pytest.approx(8 * 1.63)


def test_every_number_in_builtin_profiles_has_a_source_comment() -> None:
    root = Path(load_hardware("h100-node").source).parent.parent
    for path in root.glob("*/*.toml"):
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            value = code.split("=", 1)[1].strip() if "=" in code else ""
            if value and value[0] in "0123456789.-":
                assert "#" in line, f"{path.name}: number without a source: {line!r}"


SOURCES = REPO / "docs" / "sources.md"
# A source is defined by a heading "### [Key]" or a table row "| [Key] | ..." of docs/sources.md.
SOURCE_DEF = re.compile(r"^(?:#{2,4} |\| )\[([^\]\s]+)\]", re.MULTILINE)
CITATION = re.compile(r"\[([^\]\s]*)\]")
# A confidence tag: a lone V, S or R (not part of a word such as "RDMA-RC" or "x16").
TAG = re.compile(r"(?<![\w.-])[VSR](?![\w-])")


def _source_keys() -> set[str]:
    keys = SOURCE_DEF.findall(SOURCES.read_text())
    assert len(keys) == len(set(keys)), "a source key is defined twice in docs/sources.md"
    return set(keys)


def _comments(text: str) -> list[tuple[int, str]]:
    """Each comment with its continuation lines, as (first line number, joined comment text).

    A comment-only line continues the comment of the line above when that line has one.
    """
    groups: list[tuple[int, str]] = []
    previous = 0
    for number, line in enumerate(text.splitlines(), 1):
        if "#" not in line:
            continue
        code, comment = line.split("#", 1)
        if not code.strip() and groups and previous == number - 1:
            groups[-1] = (groups[-1][0], groups[-1][1] + " " + comment.strip())
        else:
            groups.append((number, comment.strip()))
        previous = number
    return groups


def _citation_problems(name: str, text: str, keys: set[str]) -> list[str]:
    """Cited keys missing from docs/sources.md, and tagged figures that cite no source."""
    problems: list[str] = []
    for number, comment in _comments(text):
        cited = CITATION.findall(comment)
        for key in cited:
            if key not in keys:
                problems.append(f"{name}:{number}: [{key}] is not a source in docs/sources.md")
        if TAG.search(comment) and not cited:
            problems.append(f"{name}:{number}: tagged V/S/R but cites no source: {comment!r}")
    return problems


def _sourced_files() -> list[Path]:
    profiles = Path(load_hardware("h100-node").source).parent.parent
    presets = policies_dir() / "presets"
    return sorted(profiles.glob("*/*.toml")) + sorted(presets.rglob("*.toml"))


def test_every_cited_source_is_in_docs_sources() -> None:
    keys = _source_keys()
    assert {"Beluga", "Vidur", "HF-Qwen3-32B", "NVIDIA-H100"} <= keys
    files = _sourced_files()
    assert len(files) >= 20
    problems: list[str] = []
    for path in files:
        text = path.read_text()
        problems += _citation_problems(path.name, text, keys)
        if not CITATION.search(text):
            problems.append(f"{path.name}: cites no source from docs/sources.md")
    assert not problems, "\n".join(problems)


def test_citation_check_catches_unknown_keys_and_uncited_tags() -> None:
    text = (
        "# header [Beluga], S\n"
        "a = 1   # [Nowhere], S\n"
        "b = 2   # from the notes, V\n"
        "c = 3   # first line of a comment\n"
        "        # continued, R\n"
        "d = 4   # RDMA-RC round trip over x16 (assumption)\n"
    )
    problems = _citation_problems("x.toml", text, {"Beluga"})
    assert problems == [
        "x.toml:2: [Nowhere] is not a source in docs/sources.md",
        "x.toml:3: tagged V/S/R but cites no source: 'from the notes, V'",
        "x.toml:4: tagged V/S/R but cites no source: 'first line of a comment continued, R'",
    ]


def _write(tmp: Path, rel: str, text: str) -> Path:
    path = tmp / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


GPU_TOML = """name = "X"
hbm_gb = 10
hbm_bw_gbps = 100
bf16_tflops = 10
pcie_gbps = 10
price_per_hour = 1
"""


def test_load_by_path_and_user_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "gpus/h100-sxm.toml", GPU_TOML)
    assert load_gpu(str(path)).hbm_bytes == 10 * GB
    assert load_gpu("h100-sxm").hbm_bytes == 80 * GB
    monkeypatch.setenv("KVTIER_PROFILE_PATH", str(tmp_path))
    assert load_gpu("h100-sxm").hbm_bytes == 10 * GB  # the user's file wins
    # a hardware profile picks the overridden GPU up by name too
    assert load_hardware("h100-node").gpu.hbm_bytes == 10 * GB


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (GPU_TOML.replace("hbm_gb = 10", "hbm_gb = -1"), "hbm_gb"),
        (GPU_TOML.replace("hbm_gb = 10", 'hbm_gb = "ten"'), "hbm_gb"),
        (GPU_TOML.replace("hbm_gb = 10\n", ""), "hbm_gb"),
        (GPU_TOML + "hbm_gbb = 3\n", "hbm_gbb"),
    ],
)
def test_bad_gpu_file_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, "bad.toml", text)
    with pytest.raises(InputError) as err:
        load_gpu(str(path))
    msg = str(err.value)
    assert str(path) in msg and f"key '{key}'" in msg and "\n" not in msg


def test_bad_hardware_keys(tmp_path: Path) -> None:
    base = Path(load_hardware("h100-node").source).read_text()
    path = _write(tmp_path, "hw.toml", base.replace("tp = 1", "tp = 3"))
    with pytest.raises(InputError, match=r"key 'topology.tp'"):
        load_hardware(str(path))
    path = _write(tmp_path, "hw2.toml", base.replace("mfu = 0.5", "mfu = 1.5"))
    with pytest.raises(InputError, match=r"hw2.toml: key 'efficiency.mfu': must be <= 1"):
        load_hardware(str(path))
    path = _write(tmp_path, "hw3.toml", base.replace('gpu = "h100-sxm"', 'gpu = "nope"'))
    with pytest.raises(InputError, match=r"key 'gpu'"):
        load_hardware(str(path))


def test_bad_toml_syntax_and_missing(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.toml", "name = \n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_model(str(path))
    with pytest.raises(InputError, match="unknown models profile"):
        load_model("no-such-model")
    with pytest.raises(InputError, match="not found"):
        load_model(str(tmp_path / "absent.toml"))


def test_model_active_params_cannot_exceed_params(tmp_path: Path) -> None:
    text = Path(load_model("Qwen3-8B").source).read_text()
    path = _write(tmp_path, "m.toml", text.replace("active_params = 8.2e9", "active_params = 9e9"))
    with pytest.raises(InputError, match=r"key 'active_params'"):
        load_model(str(path))


def test_a_profile_with_an_unknown_key_lists_the_valid_ones(tmp_path: Path) -> None:
    text = (REPO / "optimizer/hardware/profiles/hardware/h100-node.toml").read_text()
    path = tmp_path / "hw.toml"
    path.write_text(text.replace("gpus_per_host = 8", "gpus_per_host = 8\ngpus_per_hots = 8"))
    with pytest.raises(InputError) as err:
        load_hardware(path)
    message = str(err.value)
    assert "key 'topology.gpus_per_hots': unknown key (did you mean 'gpus_per_host'?)" in message
    assert "valid keys: " in message and "hosts" in message.split("valid keys: ")[1].split(", ")


def test_gpt_oss_window_bounded_kv_and_weights() -> None:
    """gpt-oss-120b: the 18 full-attention layers' KV grows with the context (36 KiB per
    token); with every layer keeping the whole context (the hybrid manager off) twice that."""
    m = load_model("gpt-oss-120b")
    assert m.full_attention_layers == 18
    assert m.kv_bytes_per_token() == 36 * KIB
    assert m.kv_bytes_per_token(window_bounded=False) == 72 * KIB
    assert m.kv_bytes_per_token("fp8") * 2 == m.kv_bytes_per_token()
    # 60.8 GiB checkpoint ([gpt-oss-model-card])
    assert m.weight_bytes == pytest.approx(60.8 * GIB, rel=0.001)
    dense = load_model("Qwen3-32B")
    assert dense.full_attention_layers == dense.layers
    assert dense.kv_bytes_per_token(window_bounded=False) == dense.kv_bytes_per_token()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("sliding_window = 128\n", "give both"),
        ("sliding_window_layers = 18\n", "give both"),
        ("sliding_window = 128\nsliding_window_layers = 36\n", "no full-attention layer"),
    ],
)
def test_sliding_window_fields_are_checked(tmp_path: Path, extra: str, match: str) -> None:
    text = Path(load_model("Qwen3-8B").source).read_text()
    head, _, rest = text.partition("params =")
    path = _write(tmp_path, "m.toml", head + extra + "params =" + rest)
    with pytest.raises(InputError, match=match):
        load_model(str(path))
