"""A study's trials keep their meaning: same setup or refused, killed workers' trials rerun,
each worker counts its own trials, and a study on read-only media can be reported on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import REPO, assert_one_line_error, invoke


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("identity") / "chat.parquet"
    write_trace(synthesize("chat", requests=150, rate=8.0, seed=5), path)
    return path


def optimize_args(trace: Path, db: Path, *extra: str) -> list[str]:
    return [
        "optimize",
        "--trace",
        str(trace),
        "--study",
        "s",
        "--storage",
        f"sqlite:///{db}",
        "--no-presets",
        "--out",
        str(db.with_suffix(".toml")),
        *extra,
    ]


def states(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("select state, count(*) from trials group by state"))


# --- the setup is part of the study ---------------------------------------------------------


@pytest.mark.parametrize(
    ("changed", "needle"),
    [
        (["--slo", "ttft_p99=0.5,tpot_p99=0.1"], "slo was ttft_p99_s=2, now ttft_p99_s=0.5"),
        (["--load", "capacity"], "load was trace, now capacity"),
        (["--rate-scale", "2"], "rate_scale was 1, now 2"),
        (["--model", "Qwen3-8B"], "model was Llama-3.1-8B, now Qwen3-8B"),
    ],
)
def test_a_rerun_with_another_setup_is_refused(trace_path, tmp_path, changed, needle) -> None:
    """A stricter SLO must not reuse verdicts made under the old one (it would write the old
    best policy, which misses the new SLO); so must load mode, rate scale and profiles."""
    db = tmp_path / "s.db"
    first = invoke(*optimize_args(trace_path, db, "--trials", "2", "--slo", "ttft_p99=2"))
    assert first.code in (0, 1), first.stderr
    base = [] if changed[0] == "--slo" else ["--slo", "ttft_p99=2"]
    again = invoke(*optimize_args(trace_path, db, "--trials", "2", *base, *changed))
    assert_one_line_error(again, "--study", "another setup", needle)
    assert states(db)["COMPLETE"] + states(db).get("PRUNED", 0) == 2  # none ran since


def test_a_rerun_with_other_prices_is_refused(trace_path, tmp_path) -> None:
    """Every trial's cost was computed at the prices of its run: trials priced at a GPU-hour
    of $2 and of $100 in one study would make the cheapest of them meaningless."""
    db = tmp_path / "s.db"
    first = invoke(*optimize_args(trace_path, db, "--trials", "2"))
    assert first.code in (0, 1), first.stderr
    prices = tmp_path / "prices.toml"
    prices.write_text("gpu_per_hour = 100\n")
    again = invoke(*optimize_args(trace_path, db, "--trials", "3", "--prices", str(prices)))
    assert_one_line_error(again, "--study", "another setup", "prices was", "gpu_per_hour=100")
    assert states(db)["COMPLETE"] + states(db).get("PRUNED", 0) == 2  # none ran since
    # the same figures from another file are the same prices: the study continues
    same = tmp_path / "same.toml"
    same.write_text("gpu_per_hour = 100\n")
    other = tmp_path / "o.db"
    ok = invoke(*optimize_args(trace_path, other, "--trials", "1", "--prices", str(prices)))
    assert ok.code in (0, 1), ok.stderr
    ok = invoke(*optimize_args(trace_path, other, "--trials", "2", "--prices", str(same)))
    assert ok.code in (0, 1), ok.stderr


def test_a_rerun_under_another_model_revision_is_refused(trace_path, tmp_path, monkeypatch) -> None:
    """Trials judged by an earlier kvtier model (another engine rule, profile or step-time
    table) must not be mixed with the current one's: the study records the revision."""
    import kvtier.search.run as run

    db = tmp_path / "s.db"
    first = invoke(*optimize_args(trace_path, db, "--trials", "2"))
    assert first.code in (0, 1), first.stderr
    monkeypatch.setattr(run, "model_revision", lambda: "0123456789abcdef")
    again = invoke(*optimize_args(trace_path, db, "--trials", "3"))
    assert_one_line_error(again, "--study", "another setup", "kvtier's model", "0123456789abcdef")
    assert states(db)["COMPLETE"] + states(db).get("PRUNED", 0) == 2  # none ran since


def test_the_model_revision_follows_the_model_files(tmp_path, monkeypatch) -> None:
    """The revision is a digest of the files that decide a replay's figures: one changed byte
    in an engine module gives another revision; the same files the same one."""
    import shutil

    import kvtier.search.revision as rev

    copy = tmp_path / "kvtier"
    copy.mkdir()
    for part in rev.MODEL_PARTS:
        src = rev.PACKAGE / part
        if src.is_file():
            shutil.copy(src, copy / part)
        else:
            shutil.copytree(src, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(rev, "PACKAGE", copy)
    rev.model_revision.cache_clear()
    a = rev.model_revision()
    rev.model_revision.cache_clear()
    assert rev.model_revision() == a
    (copy / "sim" / "reference.py").write_text((copy / "sim" / "reference.py").read_text() + "#")
    rev.model_revision.cache_clear()
    assert rev.model_revision() != a
    rev.model_revision.cache_clear()


def test_the_same_setup_continues(trace_path, tmp_path) -> None:
    db = tmp_path / "s.db"
    args = optimize_args(trace_path, db, "--slo", "ttft_p99=2", "--json")
    assert invoke(*args, "--trials", "2").code in (0, 1)
    second = invoke(*args, "--trials", "4")
    assert second.code in (0, 1), second.stderr
    data = json.loads(second.stdout)
    assert (data["trials"], data["new_trials"]) == (4, 2)


# --- killed workers ---------------------------------------------------------------------------


def worker(trace: Path, db: Path, trials: int, seed: int, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kvtier", *optimize_args(trace, db, "--trials", str(trials))]
        + ["--seed", str(seed), "--no-warm-start", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=db.parent,
    )


def test_a_killed_workers_trial_is_rerun(trace_path, tmp_path) -> None:
    db = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVTIER_HEARTBEAT_S": "1"}
    proc = worker(trace_path, db, 10_000, 0, env)
    running: list[tuple[int, str]] = []
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            if not db.exists():
                continue
            try:
                with sqlite3.connect(db, timeout=5) as con:
                    done = con.execute("select count(*) from trials where state='COMPLETE'")
                    if done.fetchone()[0] < 2:
                        continue
                    running = list(
                        con.execute("select number, state from trials where state='RUNNING'")
                    )
            except sqlite3.OperationalError:
                continue
            if running:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None and not running:
            proc.kill()
        proc.communicate(timeout=60)
    assert running, "no trial was seen running"
    assert proc.returncode == -signal.SIGKILL
    with sqlite3.connect(db) as con:
        number = running[0][0]
        (state,) = con.execute(f"select state from trials where number={number}").fetchone()
        params = dict(
            con.execute(
                "select param_name, param_value from trial_params p join trials t "
                f"on p.trial_id = t.trial_id where t.number={number}"
            )
        )
    # Without a heartbeat the trial would stay RUNNING for ever; after the grace period (3
    # beats) the next worker fails it and runs it again with the same parameters.
    assert state in ("RUNNING", "COMPLETE", "PRUNED")
    time.sleep(4)
    ran = sum(n for k, n in states(db).items() if k in ("COMPLETE", "PRUNED", "FAIL"))
    resumed = subprocess.run(  # --trials is the study's total: one more than it holds
        [sys.executable, "-m", "kvtier", *optimize_args(trace_path, db, "--trials", str(ran + 1))]
        + ["--no-warm-start", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert resumed.returncode in (0, 1), resumed.stderr
    assert json.loads(resumed.stdout)["new_trials"] == 1
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from trials where state='RUNNING'").fetchone()[0] == 0
        if state == "RUNNING":
            (after,) = con.execute(f"select state from trials where number={number}").fetchone()
            assert after == "FAIL"
            retried = con.execute(
                "select t.number, t.state from trials t join trial_system_attributes a "
                "on a.trial_id = t.trial_id where a.key = 'failed_trial' and a.value_json = ?",
                (str(number),),
            ).fetchall()
            assert len(retried) == 1 and retried[0][1] in ("COMPLETE", "PRUNED"), retried
            got = dict(
                con.execute(
                    "select param_name, param_value from trial_params p join trials t "
                    f"on p.trial_id = t.trial_id where t.number={retried[0][0]}"
                )
            )
            # A kill between two suggestions leaves some parameters; the rerun keeps them.
            assert params.items() <= got.items(), (params, got)


def test_a_trial_killed_before_its_first_heartbeat_is_rerun(
    trace_path, tmp_path, monkeypatch
) -> None:
    """Optuna marks a trial RUNNING before its heartbeat thread writes the first beat; a
    worker killed in between leaves a trial Optuna's own stale check never finds."""
    import optuna

    from kvtier.search.study import open_study

    monkeypatch.setenv("KVTIER_HEARTBEAT_S", "1")
    db = tmp_path / "s.db"
    first = invoke(*optimize_args(trace_path, db, "--trials", "1", "--no-warm-start"))
    assert first.code in (0, 1), first.stderr
    study = open_study("s", storage=f"sqlite:///{db}", seed=0, pareto=False)
    orphan = study.ask()  # RUNNING, no heartbeat: what a kill right after ask() leaves
    time.sleep(3.5)  # past the grace period of 3 beats
    resumed = invoke(*optimize_args(trace_path, db, "--trials", "2", "--no-warm-start"))
    assert resumed.code in (0, 1), resumed.stderr
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[orphan.number].state == optuna.trial.TrialState.FAIL
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == orphan.number]
    assert len(retries) == 1
    assert retries[0].state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def test_concurrent_workers_each_report_their_own_trials(trace_path, tmp_path) -> None:
    db = tmp_path / "s.db"
    first = invoke(*optimize_args(trace_path, db, "--trials", "1", "--no-warm-start"))
    assert first.code in (0, 1), first.stderr  # the study exists before the workers start
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [worker(trace_path, db, 13, seed, env) for seed in (1, 2)]  # the study's total
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode in (0, 1), err
    reports = [json.loads(out) for out, _ in outs]
    mine = [r["new_trials"] for r in reports]
    # each counts only its own; together they fill the study to 13 (one running when the
    # other saw it full may finish on top; a worker that starts late may find it full)
    ran = sum(n for k, n in states(db).items() if k in ("COMPLETE", "PRUNED", "FAIL"))
    assert ran == 1 + sum(mine) and 13 <= ran <= 14
    # a trial the other filled the study under may be left enqueued, never running
    assert "RUNNING" not in states(db)


# --- reading a study that cannot be written -----------------------------------------------


@pytest.fixture()
def finished_study(trace_path, tmp_path) -> Path:
    db = tmp_path / "s.db"
    r = invoke(*optimize_args(trace_path, db, "--trials", "3", "--no-warm-start"))
    assert r.code in (0, 1), r.stderr
    return db


def test_report_opens_sqlite_read_only(finished_study, monkeypatch) -> None:
    import optuna

    from kvtier.report import study as report_study

    urls: list[str] = []
    original = optuna.storages.RDBStorage.__init__

    def spy(self, url, *args, **kwargs):  # noqa: ANN001, ANN202
        urls.append(url)
        return original(self, url, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", spy)
    study = report_study.load_existing_study("s", f"sqlite:///{finished_study}")
    assert len(study.trials) == 3
    assert urls and all(u.startswith("sqlite:///file:") and "mode=ro" in u for u in urls), urls


@pytest.fixture()
def public_dir() -> Iterator[Path]:
    """A directory every user can enter (pytest's own are private to their owner)."""
    path = Path(tempfile.mkdtemp(prefix="kvtier-ro-"))
    path.chmod(0o755)
    yield path
    for sub in (path, *path.iterdir()):
        sub.chmod(0o755)
    shutil.rmtree(path)


def test_report_on_a_read_only_copy(finished_study, public_dir) -> None:
    """A chmod'ed copy (root ignores the bits, so the report also runs as ``nobody``, for
    whom the directory and the file really are read-only), without its -wal and -shm."""
    ro_dir = public_dir / "ro"
    ro_dir.mkdir()
    copy = ro_dir / "s.db"
    with sqlite3.connect(finished_study) as con:
        con.execute("pragma wal_checkpoint(TRUNCATE)")
    shutil.copy(finished_study, copy)
    copy.chmod(0o444)
    ro_dir.chmod(0o555)
    before = copy.read_bytes()
    args = ["report", "--study", "s", "--storage", f"sqlite:///{copy}", "--json"]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        # For nobody the -shm file SQLite wants beside a WAL database cannot be made either.
        nobody = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            + [sys.executable, "-m", "kvtier", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(ro_dir)},
            cwd=ro_dir,
            timeout=300,
        )
        assert nobody.returncode == 0, nobody.stderr
        assert json.loads(nobody.stdout)["finished"] == 3
        assert sorted(p.name for p in ro_dir.iterdir()) == ["s.db"]
    as_user = invoke(*args)
    assert as_user.code == 0, as_user.stderr
    assert json.loads(as_user.stdout)["finished"] == 3
    assert copy.read_bytes() == before


def test_an_unmakeable_runs_directory_is_one_line(trace_path, tmp_path, monkeypatch) -> None:
    """The default study and policy file go under ./runs; where it cannot be made (a file of
    that name, a read-only working directory) the job says so before any work."""
    (tmp_path / "runs").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    result = invoke("optimize", "--trace", str(trace_path), "--trials", "1", "--no-presets")
    assert_one_line_error(result, "runs", "--storage")


def test_max_hosts_where_runs_cannot_be_made_is_one_line(trace_path, tmp_path, monkeypatch) -> None:
    """The --max-hosts profile is always written under ./runs, whatever --storage and --out
    say: the error names that file and a way round it, not the options that would not help."""
    (tmp_path / "runs").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    result = invoke(
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "1",
        "--no-presets",
        "--max-hosts",
        "2",
        "--storage",
        f"sqlite:///{tmp_path / 'elsewhere.db'}",
        "--out",
        str(tmp_path / "elsewhere.toml"),
    )
    assert_one_line_error(result, "--max-hosts", "runs/h100-node-x2.toml", "--hardware")
    assert "--storage" not in result.stderr and "--out" not in result.stderr
