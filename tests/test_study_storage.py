"""Studies shared by concurrent workers: SQLite by default, PostgreSQL for many machines.

Workers started together on a new database race to create Optuna's schema; every worker must
still run its trials into the one study. Unreachable databases are one-line errors.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import REPO, assert_one_line_error, run_cli

WORKERS = 3
TRIALS = 2


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("storage") / "chat.parquet"
    write_trace(synthesize("chat", requests=150, rate=8.0, seed=5), path)
    return path


def start_workers(trace: Path, storage: str, cwd: Path) -> list[subprocess.CompletedProcess]:
    """``WORKERS`` optimize processes on one study, started at the same moment."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvtier.cli",
                "optimize",
                "--trace",
                str(trace),
                "--trials",
                str(WORKERS * TRIALS),  # the study's total, shared by the workers
                "--study",
                "shared",
                "--storage",
                storage,
                "--seed",
                str(i),
                "--no-presets",
                "--out",
                str(cwd / f"policy-{i}.toml"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        for i in range(WORKERS)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def test_concurrent_workers_share_a_new_sqlite_study(trace_path, tmp_path) -> None:
    db = tmp_path / "shared.db"
    for r in start_workers(trace_path, f"sqlite:///{db}", tmp_path):
        assert r.returncode == 0, r.stderr
    with sqlite3.connect(db) as con:
        states = dict(con.execute("select state, count(*) from trials group by state"))
        (mode,) = con.execute("pragma journal_mode").fetchone()
    # each stops once the study holds the total; ones still running then finish theirs.
    # Warm-start trials that workers racing on the new study both enqueued may be left
    # waiting (a later run with a larger total runs them first); none is lost or running.
    assert set(states) <= {"COMPLETE", "WAITING"}
    assert WORKERS * TRIALS <= states["COMPLETE"] < WORKERS * TRIALS + WORKERS
    assert mode == "wal"  # commits append to a log instead of syncing the database each time


def test_unreachable_postgresql_is_a_one_line_error(trace_path, tmp_path) -> None:
    result = run_cli(
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "1",
        "--storage",
        "postgresql://kvtier@127.0.0.1:1/kvtier",
        cwd=str(tmp_path),
    )
    assert_one_line_error(result, "option --storage", "cannot open study")


def _system_pg_bin() -> Path | None:
    """The newest server from the system's packages (Debian/Ubuntu keep each major version in
    /usr/lib/postgresql/N/bin, off PATH), else an ``initdb`` on PATH."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: [int(x) for x in p.parent.parent.name.split(".") if x.isdigit()],
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _pgserver_bin() -> Path | None:
    """The server binaries bundled in the ``pgserver`` wheel (the test extra): the directory
    its ``_commands.POSTGRES_BIN_PATH`` names, pgserver/pginstall/bin. Found without importing
    the package, whose import looks up a per-user runtime directory (a warning without
    XDG_RUNTIME_DIR) that these tests do not use."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bindir if (bindir / "initdb").is_file() else None


def _server_user() -> str:
    """Whom a root test run starts the server as (it refuses root): ``postgres`` where the
    system's packages created it, else ``nobody``, which every Linux system has."""
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "nobody"
    return "postgres"


def _runs_as(as_user: list[str], bindir: Path, cwd: Path) -> bool:
    """Whether ``as_user`` can execute the binaries and load their libraries: a non-root user
    cannot reach a virtual environment under a directory only root may enter (/root, a 0700
    home)."""
    for exe in ("initdb", "pg_ctl", "postgres"):
        version = subprocess.run([*as_user, str(bindir / exe), "-V"], capture_output=True, cwd=cwd)
        if version.returncode != 0:
            return False
    return True


def _copy_pgserver(bindir: Path, dest: Path) -> Path:
    """The wheel's bin/lib/share tree copied under ``dest`` with the relative layout the
    binaries rely on: the server finds share/ and lib/ next to bin/, and initdb's RPATH is
    $ORIGIN/../../../pgserver.libs (the wheel's bundled libpq)."""
    prefix = bindir.parent  # pgserver/pginstall
    out = dest / prefix.parent.name / prefix.name
    for sub in ("bin", "lib", "share"):
        shutil.copytree(prefix / sub, out / sub, symlinks=True)
    libs = prefix.parent.parent / "pgserver.libs"
    if libs.is_dir():
        shutil.copytree(libs, dest / libs.name, symlinks=True)
    for d in (dest, *dest.rglob("*")):
        if d.is_dir():
            d.chmod(0o755)
    return out / "bin"


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throw-away PostgreSQL cluster on a free local port: the system's server binaries,
    else the ones the ``pgserver`` wheel of the test extra bundles."""
    pytest.importorskip("psycopg", reason="the 'postgres' extra is not installed")
    bindir = _system_pg_bin()
    from_wheel = bindir is None
    if from_wheel:
        bindir = _pgserver_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (system packages or the pgserver wheel)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser")
    # Not under pytest's base directory, which only its owner may enter.
    root = Path(tempfile.mkdtemp(prefix="kvtier-pg-"))
    root.chmod(0o755)
    data = root / "data"
    data.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        user = _server_user()
        as_user = ["runuser", "-u", user, "--"]
        shutil.chown(data, user)
        if from_wheel and not _runs_as(as_user, bindir, root):
            bindir = _copy_pgserver(bindir, root / "pginstall")
        if not _runs_as(as_user, bindir, root):
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"user {user} cannot run the PostgreSQL binaries in {bindir}")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init = subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[:200]}")
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
    ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data)]
    # the server's output goes to its log file: a pipe it inherited would keep run() waiting
    start = subprocess.run(
        [*ctl, "-o", opts, "-l", str(data / "log"), "-w", "start"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    if start.returncode != 0:
        log = (data / "log").read_text(errors="replace") if (data / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"the PostgreSQL server did not start: {(start.stderr + log).strip()[-200:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "fast", "stop"], capture_output=True, cwd=root)
        shutil.rmtree(root, ignore_errors=True)


def test_concurrent_workers_share_a_new_postgresql_study(
    postgres_url, trace_path, tmp_path
) -> None:
    import psycopg

    for r in start_workers(trace_path, postgres_url, tmp_path):
        assert r.returncode == 0, r.stderr
    with psycopg.connect(postgres_url) as con:
        states = dict(con.execute("select state, count(*) from trials group by state").fetchall())
    # each stops once the study holds the total; ones still running then finish theirs.
    # Warm-start trials that workers racing on the new study both enqueued may be left
    # waiting (a later run with a larger total runs them first); none is lost or running.
    assert set(states) <= {"COMPLETE", "WAITING"}
    assert WORKERS * TRIALS <= states["COMPLETE"] < WORKERS * TRIALS + WORKERS


def test_a_table_another_worker_just_created_is_retried(tmp_path, monkeypatch) -> None:
    """PostgreSQL reports a schema race as "relation ... already exists" (a ProgrammingError,
    not an IntegrityError); the worker that loses it retries and opens the study."""
    import optuna
    import sqlalchemy.exc

    from kvtier.search import study as study_mod

    real = optuna.create_study
    calls = []

    def racing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        if len(calls) == 1:
            orig = Exception('relation "studies" already exists')
            raise sqlalchemy.exc.ProgrammingError("CREATE TABLE studies", {}, orig)
        return real(*args, **kwargs)

    monkeypatch.setattr(study_mod.optuna, "create_study", racing)
    monkeypatch.setattr(study_mod.time, "sleep", lambda _s: None)
    url = f"sqlite:///{tmp_path / 'race.db'}"
    opened = study_mod.open_study("race", storage=url, seed=0, pareto=False)
    assert opened.study_name == "race" and len(calls) == 2


def test_a_resumed_study_does_not_replay_its_first_trials(tmp_path) -> None:
    """A study cut during the sampler's random start and resumed under the same --seed must
    not propose again the parameter sets it already ran: a sampler made afresh with that seed
    would draw the same random stream from its start."""
    import optuna

    from kvtier.search.space import load_space
    from kvtier.search.study import open_study

    space = load_space("default")
    storage = f"sqlite:///{tmp_path / 'resume.db'}"

    def objective(trial: optuna.Trial) -> float:
        return float(len(space.suggest(trial)))

    open_study("resume", storage=storage, seed=0, pareto=False).optimize(objective, n_trials=4)
    resumed = open_study("resume", storage=storage, seed=0, pareto=False)
    resumed.optimize(objective, n_trials=6)
    ran = [t.params for t in resumed.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    assert len(ran) == 10
    repeats = [i for i, p in enumerate(ran) if p in ran[:i]]
    assert repeats == [], repeats
    # a new study under a seed is unchanged: the same seed proposes the same first trials
    a = open_study("fresh-c", storage=storage, seed=0, pareto=False)
    b = open_study("fresh-d", storage=storage, seed=0, pareto=False)
    a.optimize(objective, n_trials=2)
    b.optimize(objective, n_trials=2)
    assert [t.params for t in a.trials] == [t.params for t in b.trials]
