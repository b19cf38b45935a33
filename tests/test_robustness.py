"""Bad input through the CLI is one line and exit code 2, never a traceback or a quiet default.

Each case is one an adversarial pass found ending in a traceback, or passing silently:
unwritable outputs, hostile policy and space files, preset and space names that reach other
paths, empty or repeated options, foreign databases, strict JSON when no request is served.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("robust") / "short.parquet"
    write_trace(synthesize("short", requests=40, rate=5.0, seed=2), path)
    return path


def optimize(trace: Path, tmp_path: Path, *args: str):  # noqa: ANN201
    return invoke(
        "optimize",
        "--trace",
        str(trace),
        "--trials",
        "1",
        "--no-presets",
        "--no-warm-start",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
        *args,
    )


def trials_in(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master")}
        return con.execute("select count(*) from trials").fetchone()[0] if "trials" in tables else 0


# --- preset and space names are names ------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../spaces/default", "../../../../../tmp/x", "", "/etc/passwd", "vllm-hbm/"]
)
def test_a_preset_is_a_name_from_the_registry(trace_path, tmp_path, name: str) -> None:
    (tmp_path / "x.toml").write_text('format = "kvtier-policy/1"\n')
    result = invoke("replay", "--trace", str(trace_path), "--preset", name)
    assert_one_line_error(result, "unknown preset", "vllm-hbm")


def test_compare_refuses_an_empty_preset(trace_path) -> None:
    assert_one_line_error(
        invoke("compare", "--trace", str(trace_path), "--preset", ""), "unknown preset"
    )


def test_user_preset_directories_still_work(trace_path, tmp_path, monkeypatch) -> None:
    (tmp_path / "mine.toml").write_text('format = "kvtier-policy/1"\nblock_tokens = 32\n')
    monkeypatch.setenv("KVTIER_PRESET_PATH", str(tmp_path))
    result = invoke("replay", "--trace", str(trace_path), "--preset", "Mine", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["n_served"] == 40


@pytest.mark.parametrize("name", ["../presets/vllm-hbm", "", "  ", "no-such-space"])
def test_a_space_is_a_name_or_a_toml_path(trace_path, tmp_path, name: str) -> None:
    assert_one_line_error(optimize(trace_path, tmp_path, "--space", name), "--space", "default")
    assert trials_in(tmp_path / "x.db") == 0


# --- options that were silently tolerated ----------------------------------------------------


def test_empty_storage_is_refused(trace_path, tmp_path) -> None:
    result = invoke("optimize", "--trace", str(trace_path), "--trials", "1", "--storage", "")
    assert_one_line_error(result, "--storage")
    assert_one_line_error(invoke("report", "--study", "x", "--storage", ""), "--storage")


def test_an_slo_term_given_twice_is_refused(trace_path, tmp_path) -> None:
    result = optimize(trace_path, tmp_path, "--slo", "ttft_p99=1,ttft_p99=2")
    assert_one_line_error(result, "--slo", "ttft_p99 twice")
    result = invoke("compare", "--trace", str(trace_path), "--slo", "ttft_p99=1,ttft_p99=2")
    assert_one_line_error(result, "twice")


def test_json_of_a_replay_that_serves_nothing_is_strict(trace_path) -> None:
    result = invoke(
        "replay", "--trace", str(trace_path), "--set", "tiers.hbm.capacity_gb=0.005", "--json"
    )
    assert result.code == 0, result.stderr
    assert "NaN" not in result.stdout
    data = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert data["n_served"] == 0 and data["n_rejected"] == 40
    assert data["ttft_p99_s"] is None and data["throughput_rps"] is None
    assert result.stderr.count("\n") == 1 and "no request was served" in result.stderr


# --- outputs checked before the work ----------------------------------------------------------


@pytest.mark.parametrize("where", ["under-a-file", "a-directory"])
def test_optimize_out_unwritable_fails_before_the_search(trace_path, tmp_path, where) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "p.toml" if where == "under-a-file" else tmp_path
    result = optimize(trace_path, tmp_path, "--out", str(out))
    assert_one_line_error(result, "--out")
    assert trials_in(tmp_path / "x.db") == 0  # refused before any trial ran


def test_optimize_default_out_unwritable_fails_before_the_search(
    trace_path, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the directory belongs")
    result = optimize(trace_path, tmp_path)
    assert_one_line_error(result, "--out", "runs is not a directory")
    assert trials_in(tmp_path / "x.db") == 0


def test_validate_markdown_unwritable(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    result = invoke("validate", "beluga", "--markdown", str(tmp_path / "file" / "v.md"))
    assert_one_line_error(result, "--markdown", "not a directory")


@pytest.mark.parametrize("option", ["--html", "--plot"])
def test_report_outputs_unwritable(trace_path, tmp_path, option: str) -> None:
    assert optimize(
        trace_path, tmp_path, "--study", "s", "--out", str(tmp_path / "p.toml")
    ).code in (
        0,
        1,
    )
    (tmp_path / "file").write_text("")
    result = invoke(
        "report",
        "--study",
        "s",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
        option,
        str(tmp_path / "file" / "r.out"),
    )
    assert_one_line_error(result, option, "not a directory")


# --- policy and space files -------------------------------------------------------------------

POLICIES = {
    "non-utf8": (b'format = "kvtier-policy/1"\nblock_tokens = 16 # \xff\xfe\n', "not UTF-8"),
    "deep": (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    "dram-1e30": (
        b'format = "kvtier-policy/1"\n[[tiers]]\nname = "hbm"\n[[tiers]]\nname = "dram"\n'
        b"capacity_gb = 1e30\n",
        "capacity_gb",
    ),
    "hbm-1e30": (
        b'format = "kvtier-policy/1"\n[[tiers]]\nname = "hbm"\ncapacity_gb = 1e30\n',
        "capacity_gb",
    ),
    "budget-2^63": (
        b'format = "kvtier-policy/1"\n[serving]\nmax_num_batched_tokens = 9223372036854775807\n',
        "max_num_batched_tokens",
    ),
    "seqs-2^40": (
        b'format = "kvtier-policy/1"\n[serving]\nmax_num_seqs = 1099511627776\n',
        "max_num_seqs",
    ),
}


@pytest.mark.parametrize("case", sorted(POLICIES))
def test_hostile_policy_files(trace_path, tmp_path, case: str) -> None:
    data, needle = POLICIES[case]
    path = tmp_path / "p.toml"
    path.write_bytes(data)
    assert_one_line_error(
        invoke("replay", "--trace", str(trace_path), "--policy", str(path)), str(path), needle
    )
    assert_one_line_error(invoke("export", str(path), "--target", "vllm"), needle)


SPACES = {
    "range-1e30": ('[params."tiers.dram.capacity_gb"]\nlow = 1e30\nhigh = 1e31\n', "<= 1000000.0"),
    "step-negative": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 4096\nstep = -16\n',
        "step must be > 0",
    ),
    "step-zero": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 4096\nstep = 0\n',
        "step must be > 0",
    ),
    "step-fraction": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 4096\nstep = 0.5\n',
        "integer step",
    ),
    "log-step": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 4096\nlog = true\n'
        "step = 16\n",
        "log range takes no step",
    ),
    "step-too-big": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 4096\nstep = 8192\n',
        "larger than the range",
    ),
    "budget-2^63": (
        '[params."serving.max_num_batched_tokens"]\nlow = 1024\nhigh = 9223372036854775807\n',
        "<= 1073741824",
    ),
    "unknown-name": ("[params.blocktokens]\nchoices = [16]\n", "unknown key 'blocktokens'"),
    "pinned-unknown": (
        "[params.block_tokens]\nchoices = [16]\n[pinned]\nfoo = 3\n",
        "unknown key 'foo'",
    ),
    "bad-choices": ("[params.block_tokens]\nchoices = [0, -16, 7]\n", "must be >= 1"),
    "eviction-nope": ('[params."tiers.dram.eviction"]\nchoices = ["lru", "nope"]\n', "nope"),
    "mixed-choices": ('[params.block_tokens]\nchoices = [16, "x", 32.5]\n', "integer"),
    "when-unknown": (
        '[params.block_tokens]\nchoices = [16, 32]\nwhen = { "nothere" = true }\n',
        "unknown key 'nothere'",
    ),
    "when-not-in-space": (
        '[params.block_tokens]\nchoices = [16, 32]\nwhen = { "tiers.cxl.enabled" = true }\n',
        "not in this space's parameters",
    ),
    "when-on-a-later-parameter": (
        '[params.block_tokens]\nchoices = [16]\nwhen = { "tiers.cxl.enabled" = true }\n'
        '[params."tiers.cxl.enabled"]\nchoices = [true, false]\n',
        "listed after it",
    ),
    "when-never-holds": (
        '[params."tiers.cxl.enabled"]\nchoices = [false]\n'
        '[params.block_tokens]\nchoices = [16]\nwhen = { "tiers.cxl.enabled" = true }\n',
        "never takes",
    ),
    "empty-choices": ("[params.block_tokens]\nchoices = []\n", "must not be empty"),
    "non-utf8": ("# \udcff\n[params.block_tokens]\nchoices = [16]\n", "cannot read"),
}


@pytest.mark.parametrize("case", sorted(SPACES))
def test_hostile_space_files_fail_before_the_search(trace_path, tmp_path, case: str) -> None:
    body, needle = SPACES[case]
    path = tmp_path / "space.toml"
    text = 'format = "kvtier-space/1"\n' + body
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    result = optimize(trace_path, tmp_path, "--space", str(path))
    assert_one_line_error(result, "space.toml", needle)
    assert trials_in(tmp_path / "x.db") == 0


def test_deeply_nested_space_file(trace_path, tmp_path) -> None:
    path = tmp_path / "space.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert_one_line_error(optimize(trace_path, tmp_path, "--space", str(path)), "space.toml")


# --- cache-engine options and storage ---------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [
        "s3fifo(small=1e-300,ghost=1e300,threshold=99999999999)",
        "s3fifo(ghost=nan)",
        "s3fifo(threshold=inf)",
        "s3fifo(threshold=1e300)",
    ],
)
def test_mrc_policy_parameters_out_of_range(trace_path, policy: str) -> None:
    result = invoke("trace", "mrc", str(trace_path), "-B", "16", "--policy", policy)
    assert_one_line_error(result, "s3fifo")


def test_a_database_of_another_application(trace_path, tmp_path) -> None:
    db = tmp_path / "x.db"
    with sqlite3.connect(db) as con:
        con.execute("create table alembic_version (version_num varchar(32))")
        con.execute("insert into alembic_version values ('abc123')")
    assert_one_line_error(optimize(trace_path, tmp_path), "--storage", "alembic_version")
    result = invoke("report", "--study", "x", "--storage", f"sqlite:///{db}")
    assert_one_line_error(result, "--storage", "alembic_version")
