"""``kvtier trace mrc``: table, JSON, plot, and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cache import miss_ratio_curve
from kvtier.trace.blocks import block_trace
from kvtier.trace.io import write_trace
from tests.helpers import invoke, make_trace


@pytest.fixture
def trace_file(tmp_path: Path) -> str:
    shared = list(range(64))
    prompts = [shared + [1000 + i] * (16 + 8 * i) for i in range(6)] + [shared[:40]]
    path = tmp_path / "t.parquet"
    write_trace(make_trace(prompts, 16), path)
    return str(path)


def test_json_matches_the_api(trace_file: str) -> None:
    res = invoke("trace", "mrc", trace_file, "--block-tokens", "16", "--json")
    assert res.code == 0, res.stderr
    doc = json.loads(res.stdout)
    from kvtier.trace.io import read_trace

    want = miss_ratio_curve(block_trace(read_trace(trace_file), 16)).to_json()
    assert doc == json.loads(json.dumps(want))
    assert doc["policy"] == "lru" and doc["points"][0]["capacity_blocks"] == 1
    assert set(doc["points"][0]) == {"capacity_blocks", "hit_ratio_blocks", "hit_ratio_tokens"}


def test_replay_policy_with_capacities_warmup_flat(trace_file: str) -> None:
    res = invoke(
        "trace", "mrc", trace_file, "-B", "16", "--policy", "s3fifo(threshold=1)",
        "--capacities", "20,40,200", "--warmup", "0.5", "--flat", "--json",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["policy"] == "s3fifo(small=0.1,ghost=0.9,threshold=1)"
    assert doc["semantics"] == "flat" and doc["method"] == "replay"
    assert [p["capacity_blocks"] for p in doc["points"]] == [20, 40, 200]


def test_table_and_plot(trace_file: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    res = invoke("trace", "mrc", trace_file, "-B", "16", "--plot", str(png))
    assert res.code == 0, res.stderr
    assert "hit ratio" in res.stdout and "%" in res.stdout and "lru" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_with_a_model_is_in_gb_on_a_log_axis(trace_file: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from kvtier.cache.plot import curve_figure
    from kvtier.hardware import load_model
    from kvtier.hardware.types import GB
    from kvtier.plotting import pyplot
    from kvtier.trace.io import read_trace

    png = tmp_path / "gb.png"
    res = invoke(
        "trace", "mrc", trace_file, "-B", "16", "--model", "Llama-3.1-8B", "--plot", str(png)
    )
    assert res.code == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = miss_ratio_curve(block_trace(read_trace(trace_file), 16))
    block_gb = load_model("Llama-3.1-8B").kv_bytes_per_token("bf16") * 16 / GB
    fig = curve_figure(result, block_gb=block_gb, model="Llama-3.1-8B bf16")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "GB of Llama-3.1-8B bf16 KV" in ax.get_xlabel()
    xs = list(ax.get_lines()[0].get_xdata())
    assert xs == pytest.approx([p.capacity_blocks * block_gb for p in result.points])
    pyplot().close(fig)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-B", "x"], "--block-tokens must be an integer"),
        (["-B", "0"], "--block-tokens must be > 0"),
        (["-B", "16", "--warmup", "1.5"], "warmup"),
        (["-B", "16", "--warmup", "half"], "--warmup must be a finite number"),
        (["-B", "16", "--capacities", "10,x"], "--capacities must be an integer"),
        (["-B", "16", "--capacities", "10,-1"], "capacities"),
        (["-B", "16", "--policy", "arc"], "unknown policy"),
        (["-B", "16", "--policy", "fifo", "--method", "stack"], "lru only"),
        (["-B", "16", "--method", "fast"], "--method"),
        (["-B", "24"], "multiple or a divisor"),
    ],
)
def test_bad_options_are_one_line_exit_2(trace_file: str, args: list[str], fragment: str) -> None:
    res = invoke("trace", "mrc", trace_file, *args)
    assert res.code == 2
    assert fragment in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_missing_trace_file(tmp_path: Path) -> None:
    res = invoke("trace", "mrc", str(tmp_path / "nope.parquet"), "-B", "16")
    assert res.code == 2 and len(res.stderr.strip().splitlines()) == 1


def test_plot_without_matplotlib_is_one_line(
    trace_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    res = invoke("trace", "mrc", trace_file, "-B", "16", "--plot", str(tmp_path / "c.png"))
    assert res.code == 2 and "kvtier[plot]" in res.stderr
    assert not (tmp_path / "c.png").exists()


def test_capacities_in_gb_of_a_models_kv(trace_file: str) -> None:
    """Llama-3.1-8B keeps 128 KiB of KV per token in bf16 (32 layers x 8 KV heads x 128 x 2 x
    2 bytes), 64 KiB in fp8: a 16-token block is 2 MiB, or 1 MiB."""
    from kvtier.hardware.types import GB

    for dtype, block_bytes in (("bf16", 2 * 2**20), ("fp8", 2**20)):
        result = invoke(
            "trace",
            "mrc",
            trace_file,
            "-B",
            "4",
            "--capacities",
            "3,6",
            "--model",
            "Llama-3.1-8B",
            "--kv-dtype",
            dtype,
            "--json",
        )
        assert result.code == 0, result.stderr
        data = json.loads(result.stdout)
        per_block = block_bytes / 4 / GB  # B = 4 tokens here
        assert data["block_gb"] == pytest.approx(per_block)
        assert [p["capacity_gb"] for p in data["points"]] == pytest.approx(
            [3 * per_block, 6 * per_block]
        )
    table = invoke("trace", "mrc", trace_file, "-B", "4", "--model", "Llama-3.1-8B")
    assert "capacity (GB, Llama-3.1-8B bf16)" in table.stdout
    bad = invoke("trace", "mrc", trace_file, "-B", "4", "--kv-dtype", "fp8")
    assert bad.code == 2 and "--model" in bad.stderr
