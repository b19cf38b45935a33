"""No command writes over what it reads or writes: its trace, its study database, another of
its outputs (kvtier.files.guard_outputs), whichever way the path is spelled."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.files import guard_outputs, sqlite_path
from tests.helpers import REPO, assert_one_line_error, invoke

TRACE = REPO / "traces" / "sample-chat.parquet"


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    shutil.copy(TRACE, tmp_path / "tr" / "a.parquet")
    return tmp_path


def unchanged(path: Path) -> None:
    assert path.read_bytes() == TRACE.read_bytes()


def test_sqlite_path_forms() -> None:
    assert sqlite_path("sqlite:///runs/x.db") == "runs/x.db"
    assert sqlite_path("sqlite:////abs/x.db") == "/abs/x.db"
    assert sqlite_path("sqlite:///file:%2Fa%20b%2Fx.db?mode=ro&uri=true") == "/a b/x.db"
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("postgresql://h/db") is None
    assert sqlite_path(None) is None


def test_guard_sees_through_dots_symlinks_and_hard_links(work: Path) -> None:
    a = work / "tr" / "a.parquet"
    os.symlink(a, work / "link.parquet")
    os.link(a, work / "hard.parquet")
    for spelled in ("./tr/../tr/a.parquet", "link.parquet", "hard.parquet", str(a)):
        with pytest.raises(InputError, match="is the input --trace"):
            guard_outputs({"--out": spelled}, {"--trace": "tr/a.parquet"})
    with pytest.raises(InputError, match="inside the input dataset directory"):
        guard_outputs({"--out": "tr/new.parquet"}, {"--trace": "tr"})
    with pytest.raises(InputError, match="study database"):
        guard_outputs({"--out": "e.db-wal"}, {}, {"--storage": "sqlite:///e.db"})
    with pytest.raises(InputError, match="same file"):
        guard_outputs({"--plot": "x.png", "--html": "./x.png"})
    guard_outputs({"--out": "other.parquet"}, {"--trace": "tr/a.parquet", "--model": "8b"})


def test_replay_requests_out_never_overwrites_the_trace(work: Path) -> None:
    a = work / "tr" / "a.parquet"
    for out in ("tr/a.parquet", "./tr/../tr/a.parquet"):
        result = invoke("replay", "--trace", "tr/a.parquet", "--requests-out", out)
        assert_one_line_error(result, "--requests-out", "is the input --trace")
        unchanged(a)


def test_optimize_out_never_overwrites_trace_or_study(work: Path) -> None:
    result = invoke("optimize", "--trace", "tr/a.parquet", "--out", "tr/a.parquet")
    assert_one_line_error(result, "--out", "is the input --trace")
    unchanged(work / "tr" / "a.parquet")
    result = invoke(
        "optimize", "--trace", "tr/a.parquet", "--storage", "sqlite:///e.db", "--out", "e.db"
    )
    assert_one_line_error(result, "--out", "study database")
    assert not (work / "e.db").exists()
    result = invoke("optimize", "--trace", "tr/a.parquet", "--study", "s", "--out", "runs/s.db")
    assert_one_line_error(result, "--out", "study database")


def test_report_outputs_never_overwrite_the_study(work: Path) -> None:
    (work / "c.db").write_bytes(b"keep")
    result = invoke("report", "--study", "S", "--storage", "sqlite:///c.db", "--html", "c.db")
    assert_one_line_error(result, "--html", "study database")
    assert (work / "c.db").read_bytes() == b"keep"
    result = invoke("report", "--study", "S", "--plot", "x.png", "--html", "x.png")
    assert_one_line_error(result, "--plot", "same file")


def test_report_storage_that_is_not_a_database(work: Path) -> None:
    (work / "NOT-A-DB").write_text("hello\n")
    result = invoke("report", "--study", "x", "--storage", "sqlite:///NOT-A-DB")
    assert_one_line_error(result, "--storage", "not a database")


def test_export_never_writes_over_its_policy(work: Path) -> None:
    policy = work / "out" / "notes.txt"
    policy.parent.mkdir()
    shutil.copy(REPO / "policies" / "presets" / "vllm-hbm.toml", policy)
    before = policy.read_bytes()
    result = invoke("export", str(policy), "--target", "vllm", "-o", "out")
    assert_one_line_error(result, "-o", "is the input POLICY.toml")
    assert policy.read_bytes() == before


def test_trace_commands_use_the_same_guard(work: Path) -> None:
    result = invoke("trace", "sample", "tr/a.parquet", "--fraction", "0.5", "-o", "tr/a.parquet")
    assert_one_line_error(result, "--output", "is the input TRACE")
    result = invoke("trace", "mrc", "tr/a.parquet", "-B", "16", "--plot", "tr/a.parquet")
    assert_one_line_error(result, "--plot", "is the input TRACE")
    unchanged(work / "tr" / "a.parquet")


def test_validate_markdown_never_lands_on_bundled_inputs(work: Path) -> None:
    target = REPO / "traces" / "validation-report.md"
    try:
        result = invoke("validate", "pd", "--markdown", str(target))
    finally:
        target.unlink(missing_ok=True)
    assert_one_line_error(result, "--markdown", "bundled traces")


@pytest.mark.parametrize(
    ("args", "option", "needle"),
    [
        (("--study", "../../x"), "--study", "plain name"),
        (("--study", ""), "--study", "empty"),
        (("--study", "  "), "--study", "empty"),
        (("--slo", ""), "--slo", "empty"),
        (("--load", "capacity", "--rate-scale", "2"), "--rate-scale", "--load trace only"),
    ],
)
def test_optimize_refuses_empty_and_escaping_options(
    work: Path, args: tuple[str, ...], option: str, needle: str
) -> None:
    result = invoke("optimize", "--trace", "tr/a.parquet", "--trials", "1", *args)
    assert_one_line_error(result, option, needle)
    assert not (work.parent / "x.db").exists()


def test_report_refuses_escaping_study_name(work: Path) -> None:
    result = invoke("report", "--study", "../x")
    assert_one_line_error(result, "--study", "plain name")


def test_batch_study_prefix_stays_a_plain_name(work: Path) -> None:
    result = invoke("batch", "tr/a.parquet", "--study-prefix", "../", "--trials", "1")
    assert_one_line_error(result, "--study-prefix", "plain name")
    assert not (work / "runs").exists()


def test_dataset_output_never_replaces_the_directory_of_its_input(work: Path) -> None:
    result = invoke("trace", "map", "tr/a.parquet", "-B", "32", "-o", "tr", "--stream")
    assert_one_line_error(result, "--output", "directory holding the input")
    unchanged(work / "tr" / "a.parquet")
