"""The Optuna study: sampler, storage, resumption, threads, and reading results back.

* Sampler: TPE, feasibility-aware through the constraints each trial sets with
  ``Trial.set_constraint`` (Optuna 5's successor of ``constraints_func``), or NSGA-II on cost
  and TTFT P99 for ``pareto``; both seeded.
* Storage: an SQLite file under ``runs/`` by default, so an interrupted study resumes when the
  same study name runs again; any Optuna storage URL (PostgreSQL for many machines).
* Every trial stores its parameters, the full policy, its metrics, the SLO violations and the
  load it was priced at as user attributes, so any trial can be exported and replayed.
"""

from __future__ import annotations

import math
import os
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc

from kvtier.errors import InputError
from kvtier.policy.model import policy_to_dict
from kvtier.search.objective import Evaluation, Evaluator, objective_metric
from kvtier.search.setup import SETUP_ATTR, StudySetup
from kvtier.search.space import SearchSpace
from kvtier.toml_fields import strict_int

RUNS_DIR = Path("runs")


def make_runs_dir(
    runs_dir: Path = RUNS_DIR,
    *,
    purpose: str = "the study and its policy file",
    advice: str = "give --storage and --out",
    option: str = "--storage",
) -> None:
    """Create the directory for the default study and policy file, or say in one line why it
    cannot be made (a file of that name, a read-only working directory) and what to give
    instead, before any trial has run.

    ``purpose``, ``advice`` and ``option`` name what needed the directory and the way round
    it that helps that need: another file (``--max-hosts``'s profile) is not moved elsewhere
    by ``--storage`` and ``--out``."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        if not runs_dir.is_dir():
            raise NotADirectoryError(0, "not a directory")
    except OSError as err:
        raise InputError(
            f"cannot make {runs_dir}/ for {purpose}: "
            f"{err.strerror or err}; run where it can be made, or {advice}",
            option=option,
        ) from None


def check_study_name(name: str | None, option: str = "--study") -> None:
    """Refuse a study name that is empty or is not one file name: the default storage and
    policy file are ``runs/NAME.db`` and ``runs/NAME.toml``, and a name with a path separator
    (``../../x``) would put them outside ``runs/``. None (the derived default) passes."""
    if name is None:
        return
    if not name.strip():
        raise InputError("must name a study, got an empty name", option=option)
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad or name in (".", "..") or name != name.strip():
        raise InputError(
            f"must be a plain name (letters, digits, '-', '_', '.'; no path separators or "
            f"surrounding spaces): the study's files go to runs/NAME.db and runs/NAME.toml, "
            f"got {name!r}",
            option=option,
        )


def default_storage(study_name: str, runs_dir: Path = RUNS_DIR) -> str:
    make_runs_dir(runs_dir)
    return f"sqlite:///{runs_dir / (study_name + '.db')}"


def make_sampler(
    *, seed: int, pareto: bool, n_startup_trials: int = 10
) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if pareto:
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=n_startup_trials, multivariate=True
        )


OPEN_ATTEMPTS = 6  # workers starting together on a new database race to create its schema


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Write-ahead logging, synced at checkpoints rather than at every commit.

    Optuna commits every parameter, attribute and state change of a trial on its own (about
    twenty per trial); with SQLite's default rollback journal each commit waits for the disk
    twice. In WAL mode with ``synchronous=NORMAL`` a commit is an append to the log: a
    process that is killed loses nothing committed, and a power cut at most the last
    commits, which leaves the study consistent (its unfinished trials are run again). WAL
    also lets readers (``kvtier report``, other workers on the same machine) proceed while a
    trial is written.
    """
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


HEARTBEAT_ENV = "KVTIER_HEARTBEAT_S"
HEARTBEAT_S = 10  # a running trial's worker writes a heartbeat this often ...
GRACE_BEATS = 3  # ... and a trial whose worker missed this many is failed and run again
MAX_RETRIES = 3  # a trial that keeps killing its worker is not retried for ever


def heartbeat_seconds() -> int:
    """The heartbeat interval: :data:`HEARTBEAT_S`, or ``$KVTIER_HEARTBEAT_S`` (whole
    seconds >= 1)."""
    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    if not raw:
        return HEARTBEAT_S
    value = strict_int(raw) or 0
    if value < 1:
        raise InputError(f"${HEARTBEAT_ENV} must be a whole number of seconds >= 1, got {raw!r}")
    return value


class HeartbeatStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage, which also finds trials killed before their first heartbeat.

    Optuna marks a trial RUNNING (``study.ask``) and only then starts the thread that writes
    its heartbeats; a worker killed between the two leaves a RUNNING trial with no heartbeat
    row, which Optuna's stale check skips, so it would stay RUNNING for ever. Such a trial
    counts as stale once it started longer than the grace period ago (by the clock of the
    machine that wrote its start time, as Optuna's ``datetime_start`` is).
    """

    def set_trial_state_values(
        self,
        trial_id: int,
        state: optuna.trial.TrialState,
        values: Any = None,
    ) -> bool:
        """Claims a waiting trial with one conditional ``UPDATE``, so that exactly one worker
        gets it.

        Optuna claims an enqueued trial by reading its state and then writing RUNNING; its
        ``SELECT ... FOR UPDATE`` is a plain read on SQLite, so two workers can both read
        WAITING, both run the trial, and the second then fails with "Cannot tell a COMPLETE
        trial". ``UPDATE ... WHERE state = 'WAITING'`` is atomic on every database (SQLite
        serialises writers); the row count says who won, and a loser moves on to the next
        waiting trial. Every other change is Optuna's own.
        """
        if state != optuna.trial.TrialState.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state, values)
        import datetime

        from optuna.storages._rdb import models

        table = models.TrialModel.__table__
        claim = (
            table.update()
            .where(table.c.trial_id == trial_id)
            .where(table.c.state == optuna.trial.TrialState.WAITING)
            .values(state=optuna.trial.TrialState.RUNNING, datetime_start=datetime.datetime.now())
        )
        with self.engine.begin() as con:
            claimed = con.execute(claim).rowcount == 1
        if not claimed:
            # another worker has it (running, or already finished: Optuna's own check would
            # raise for a finished one, which a worker that lost the race by a trial's length
            # meets too); a trial that does not exist raises KeyError, as Optuna's does
            self.get_trial(trial_id)
        return claimed

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        import datetime

        stale = list(super()._get_stale_trial_ids(study_id))
        grace = datetime.timedelta(seconds=self.grace_period or 2 * (self.heartbeat_interval or 0))
        now = datetime.datetime.now()
        running = self.get_all_trials(
            study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)
        )
        old = [
            t._trial_id
            for t in running
            if t._trial_id not in stale
            and t.datetime_start is not None
            and now - t.datetime_start > grace
        ]
        if old:
            with self.engine.connect() as con:
                beating = {
                    row[0]
                    for row in con.execute(sqlalchemy.text("select trial_id from trial_heartbeats"))
                }
            stale += [trial_id for trial_id in old if trial_id not in beating]
        return stale


def study_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage to hand to Optuna: an ``RDBStorage`` with a heartbeat, and for SQLite
    connections that use write-ahead logging (see :func:`_sqlite_pragmas`).

    The heartbeat is how a study notices a worker killed mid-trial (``kill -9``, a lost
    machine): that trial stops beating, and the next worker to start a trial after the grace
    period marks it failed; ``RetryHeartbeatStaleTrialCallback`` (Optuna 5's name for
    ``RetryFailedTrialCallback``) enqueues it again with the same parameters, so a resumed
    study runs it instead of leaving it RUNNING
    for ever.
    """
    beat = heartbeat_seconds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        rdb = HeartbeatStorage(
            url,
            heartbeat_interval=beat,
            grace_period=beat * GRACE_BEATS,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=MAX_RETRIES
            ),
        )
    if url.startswith("sqlite"):
        sqlalchemy.event.listen(rdb.engine, "connect", _sqlite_pragmas)
        rdb.engine.dispose()  # connections made while creating the schema lack the pragmas
    return rdb


def sqlite_file(url: str) -> Path | None:
    """The file of a plain ``sqlite:///PATH`` URL (no query), else None."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url or url[len(prefix) :] in ("", ":memory:"):
        return None
    return Path(url[len(prefix) :])


def read_only_url(path: Path, *, immutable: bool = False) -> str:
    """An SQLite URL that opens ``path`` read-only (``mode=ro``), through SQLite's URI form.

    ``immutable`` also tells SQLite that nothing else writes the file, so it needs no
    ``-shm`` file: the way to read a write-ahead-logged database on read-only media.
    """
    from urllib.parse import quote

    flags = "mode=ro&immutable=1" if immutable else "mode=ro"
    return f"sqlite:///file:{quote(str(path.resolve()))}?{flags}&uri=true"


def read_only_storage(url: str, study_name: str) -> optuna.storages.RDBStorage:
    """Storage for reading a study (``kvtier report``): nothing is created or written.

    An SQLite file opens read-only, so a study on read-only media or in a directory one may
    not write can be reported on. In WAL mode SQLite needs the ``-shm`` file beside the
    database; when it is missing and cannot be made, the file is opened as immutable.
    Other URLs are passed through, with table creation skipped.
    """
    path = sqlite_file(url)
    if path is None:
        return optuna.storages.RDBStorage(url, skip_table_creation=True)
    try:
        found = path.is_file()
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}", option="--storage") from None
    if not found:
        raise InputError(f"no study {study_name!r}: {path} does not exist", option="--study")
    try:
        return optuna.storages.RDBStorage(read_only_url(path), skip_table_creation=True)
    except (sqlalchemy.exc.OperationalError, optuna.exceptions.StorageInternalError):
        return optuna.storages.RDBStorage(
            read_only_url(path, immutable=True), skip_table_creation=True
        )


_INTERRUPTED: set[str] = set()  # trials whose failure by Ctrl-C was not shown


def _not_an_interrupt(record: Any) -> bool:
    """False for Optuna's two warnings about a trial failed by Ctrl-C."""
    import re

    text = record.getMessage()
    number = re.match(r"Trial (\d+) failed", text)
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, KeyboardInterrupt) or "KeyboardInterrupt" in text:
        if number:
            _INTERRUPTED.add(number.group(1))
        return False
    return not (number and number.group(1) in _INTERRUPTED and "with value None" in text)


def quiet_interrupts() -> None:
    """Drop Optuna's warnings about a trial failed by Ctrl-C (its parameters and a
    traceback): the command says in one line that the study is kept and how to continue."""
    import logging

    optuna.logging.get_logger("optuna")  # makes Optuna's handler, if it has none yet
    for handler in logging.getLogger("optuna").handlers:
        if _not_an_interrupt not in handler.filters:
            handler.addFilter(_not_an_interrupt)


def open_study(study_name: str, *, storage: str | None, seed: int, pareto: bool) -> optuna.Study:
    """Create the study, or load it to continue when it exists.

    Many workers (``optimize`` on many machines) may open one study on a shared database at
    the same moment. Optuna creates the schema and the study on first use, and concurrent
    creators can collide (a unique-constraint violation or a table that already exists on
    PostgreSQL, "database is locked" on SQLite); the loser retries after a short random wait
    and then finds both in place.
    """
    if storage is not None and not storage.strip():
        raise InputError(
            "must be an Optuna storage URL (sqlite:///FILE.db, postgresql://...); leave it out "
            "for the default sqlite:///runs/STUDY.db",
            option="--storage",
        )
    url = storage or default_storage(study_name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    quiet_interrupts()
    directions = ["minimize", "minimize"] if pareto else ["minimize"]
    for attempt in range(OPEN_ATTEMPTS):
        try:
            study = optuna.create_study(
                study_name=study_name,
                storage=study_storage(url),
                sampler=make_sampler(seed=seed, pareto=pareto),
                directions=directions,
                load_if_exists=True,
            )
            break
        except (
            sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.OperationalError,
            sqlalchemy.exc.ProgrammingError,  # PostgreSQL: "relation ... already exists"
            optuna.exceptions.DuplicatedStudyError,
        ) as err:
            if attempt + 1 == OPEN_ATTEMPTS or not _creation_race(err):
                raise storage_error(study_name, url, err) from None
            time.sleep(random.uniform(0.2, 1.0) * (attempt + 1))
        except (
            ValueError,
            ImportError,
            RuntimeError,  # a database whose alembic_version is not Optuna's schema
            optuna.exceptions.OptunaError,
            sqlalchemy.exc.SQLAlchemyError,
        ) as err:
            raise storage_error(study_name, url, err) from None
    held = len(study.get_trials(deepcopy=False))
    if held:
        # A resumed study: a sampler seeded as the first run's would draw its random stream
        # from the start again, and while fewer trials than TPE's startup count have finished
        # (its random phase) propose the parameter sets the first run already ran. The seed
        # is mixed with the trial count, so a resume is as reproducible but draws anew.
        study.sampler = make_sampler(seed=resumed_seed(seed, held), pareto=pareto)
    if len(study.directions) != len(directions):
        raise InputError(
            f"study {study_name!r} exists with {len(study.directions)} objective(s); "
            f"{'--pareto needs' if pareto else 'a single-objective run needs'} a new --study name",
            option="--study",
        )
    name_metrics(study, pareto=pareto)
    return study


# What each objective is, for optuna-dashboard and ``study.trials_dataframe()`` (which label
# it "Objective 0" without a name): cost per 1M tokens (or with --objective energy joules per
# token), and with --pareto TTFT P99.
METRIC_NAMES = ("cost_per_mtok", "ttft_p99_s")

# The metrics each trial also stores as user attributes of their own (besides the full
# ``metrics`` dict), so that optuna-dashboard's trial table shows and sorts them as columns.
TRIAL_METRICS = (
    "cost_per_mtok",
    "cost_per_hour",
    "ttft_p99_s",
    "ttft_mean_s",
    "tpot_p99_s",
    "throughput_tps",
    "tokens_per_joule",
    "instances",
    "gpus",
)


def name_metrics(study: optuna.Study, *, pareto: bool, objective: str = "cost") -> None:
    """Name the study's objectives (Optuna's ``set_metric_names``), once."""
    names = [objective_metric(objective), *METRIC_NAMES[1 : 2 if pareto else 1]]
    if study.metric_names == names:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(names)


def resumed_seed(seed: int, held: int) -> int:
    """The sampler seed of a run that finds ``held`` trials in its study: ``seed`` and
    ``held`` mixed by NumPy's ``SeedSequence`` (a 32-bit seed, as NumPy's generators take)."""
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**32, held]).generate_state(1)[0])


IDENTITY = (
    "hardware", "model", "slo", "load", "rate_scale", "prices", "objective", "model_revision",
)  # fmt: skip


def check_study_setup(study: optuna.Study, setup: StudySetup, storage: str) -> None:
    """Refuse to continue a study whose trials were judged under another setup.

    A trial's verdict (its constraints, ``feasible``) and its price depend on the hardware
    and model it ran on, the SLO it was held to, the load mode and the rate scale, besides the
    trace (checked by :func:`kvtier.search.setup.check_study_trace`). Mixing trials of two setups
    in one study would let the sampler and the final choice trust verdicts made under rules
    that no longer hold, so a rerun must keep the setup or use another ``--study`` name. A
    study without trials takes the new setup.
    """
    recorded = study.user_attrs.get(SETUP_ATTR)
    if not recorded or not study.get_trials(deepcopy=False):
        return
    current = setup.to_attrs()[SETUP_ATTR]
    # a study recorded without an objective minimised cost, as a run without --objective does
    recorded = {"objective": "cost", **recorded}
    current = {"objective": "cost", **current}
    changed = [k for k in IDENTITY if k in recorded and recorded[k] != current[k]]
    if changed:
        what = "; ".join(_changed(k, recorded[k], current[k]) for k in changed)
        raise InputError(
            f"study {study.study_name!r} in {storage} was run with another setup ({what}); "
            "its trials' verdicts would not hold: rerun with the same options or choose "
            "another --study name",
            option="--study",
        )


def check_study_space(study: optuna.Study, space: SearchSpace, storage: str) -> None:
    """Refuse, before the first new trial, a space that changes a parameter's distribution in
    a way the study cannot take.

    Optuna keeps one distribution per parameter name in a study and raises mid-trial (a
    traceback, after the replay) when a trial asks for another kind of distribution (a range
    where there were choices, integers where there were floats), another log setting, or other
    choices (their order included). Other changes are compatible: a parameter the study never
    searched, one the space drops (or pins), and a range's new bounds or step (trials outside
    the new range stay in the study). Each free parameter is checked with Optuna's own rule
    (:func:`optuna.distributions.check_distribution_compatibility`) against the distribution
    the study first stored for it, as Optuna does.
    """
    from optuna.distributions import check_distribution_compatibility

    stored: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, dist in trial.distributions.items():
            stored.setdefault(name, dist)
    for param in space.free():
        old = stored.get(param.name)
        if old is None:
            continue
        new = param.distribution()
        try:
            check_distribution_compatibility(old, new)
        except ValueError:
            setup = study.user_attrs.get(SETUP_ATTR) or {}
            before = _space_name(str(setup.get("space") or "")) or "its earlier one"
            raise InputError(
                f"study {study.study_name!r} in {storage} searched {param.name} over "
                f"{_describe(old)}; space {_space_name(space.source) or '<space>'} gives "
                f"{_describe(new)}, which Optuna cannot mix in one study: choose another "
                f"--study name, or rerun with the space it ran with ({before})",
                option="--space",
            ) from None


def _space_name(source: str) -> str:
    """A space as ``--space`` takes it: a built-in by name, else its file."""
    from kvtier.search.space import SPACES_DIR

    path = Path(source)
    if source and path.parent.resolve() == SPACES_DIR.resolve() and path.suffix == ".toml":
        return path.stem
    return source


def _describe(dist: Any) -> str:
    """An Optuna distribution in the words of a space file."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        shown = (str(c).lower() if isinstance(c, bool) else str(c) for c in dist.choices)
        return "choices " + ", ".join(shown)
    kind = "integers" if isinstance(dist, IntDistribution) else "numbers"
    text = f"{kind} {dist.low:g} to {dist.high:g}"
    if dist.step is not None and not (isinstance(dist, IntDistribution) and dist.step == 1):
        text += f", step {dist.step:g}"
    return text + (", log scale" if dist.log else "")


def _flat(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _changed(key: str, was: Any, now: Any) -> str:
    """One changed setup item in words; of the price figures only those that differ."""
    if key == "model_revision":
        return f"kvtier's model (simulator, profiles, step-time data) was revision {was}, now {now}"
    if key == "prices" and isinstance(was, dict) and isinstance(now, dict):
        a, b = _flat(was), _flat(now)
        keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        was = {k: a.get(k, "none") for k in keys}
        now = {k: b.get(k, "none") for k in keys}
    return f"{key} was {_show(was)}, now {_show(now)}"


def _show(value: Any, prefix: str = "") -> str:
    if isinstance(value, dict):
        return (
            ",".join(
                _show(v, f"{prefix}{k}.") if isinstance(v, dict) else f"{prefix}{k}={_show(v)}"
                for k, v in value.items()
            )
            or "none"
        )
    return f"{value:g}" if isinstance(value, float) else str(value)


def _creation_race(err: Exception) -> bool:
    """Did ``err`` come from another worker creating the same schema or study just now?"""
    if isinstance(err, sqlalchemy.exc.IntegrityError | optuna.exceptions.DuplicatedStudyError):
        return True
    text = str(err).lower()
    return "already exists" in text or "database is locked" in text


def storage_error(study_name: str, url: str, err: Exception) -> InputError:
    """A storage failure as one line: the database's own first line, and the driver to
    install when one is missing."""
    if isinstance(err, optuna.exceptions.StorageInternalError) and err.__cause__ is not None:
        err = err.__cause__  # the database's own words ("file is not a database")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, RuntimeError) and "compatible with the table schema" in first:
        first = (
            f"its alembic_version table names a schema this Optuna ({optuna.__version__}) "
            "does not know: a database of another application, or of a newer Optuna"
        )
    if isinstance(err, ImportError) and url.startswith("postgresql"):
        first += " (pip install 'kvtier[postgres]')"
    return InputError(f"cannot open study {study_name!r} at {url}: {first}", option="--storage")


def record(trial: optuna.Trial, ev: Evaluation) -> None:
    trial.set_user_attr("params", ev.values)
    trial.set_user_attr("policy", policy_to_dict(ev.policy))
    trial.set_user_attr("metrics", ev.metrics.to_dict())
    trial.set_user_attr("violations", ev.violations)
    values = ev.constraints()
    for key, value in zip(ev.violations, values, strict=True):
        trial.set_constraint(key, value)  # <= 0 is satisfied; the samplers read these
    # optuna-dashboard shows the list under the system attribute ``constraints`` (the format
    # of ``constraints_func``); Optuna reads it too, as the same values under other names.
    trial.storage.set_trial_system_attr(trial._trial_id, "constraints", list(values))
    trial.set_user_attr("feasible", ev.feasible)
    trial.set_user_attr("slo", "met" if ev.feasible else "missed")
    trial.set_user_attr("rate_scale", ev.rate_scale)
    trial.set_user_attr("replays", ev.replays)
    metrics = ev.metrics.to_dict()
    for key in TRIAL_METRICS:
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # JSON has no infinity: a run that served nothing stores None
            trial.set_user_attr(key, value if math.isfinite(value) else None)
    hits = metrics.get("hit_ratio_tokens") or {}
    for tier, ratio in hits.items():
        trial.set_user_attr(f"hit_ratio_{tier}", float(ratio))


OUTCOME_ATTR = "outcome"  # the study's user attribute: the presets and the tiering verdict
# Optional study attributes that ``kvtier report --html`` draws when present (their shapes:
# kvtier.report.html): cost and latency against each lower tier's capacity around the winner,
# and the winner's hit ratio per tier over time.
HIT_RATIO_OVER_TIME_ATTR = "hit_ratio_over_time"


def record_outcome(
    study: optuna.Study, *, baselines: list[Any], tiered: Any, hbm_only: Any
) -> None:
    """Keep what the latest run compared the winner with, for ``kvtier report``: every
    preset's metrics and SLO verdict (or why it did not apply), and the cheapest tiered and
    HBM-only policies meeting the SLO (:mod:`kvtier.search.tiering`).

    ``baselines`` are :class:`kvtier.search.run.Baseline`; ``tiered`` and ``hbm_only``
    :class:`kvtier.search.run.Choice` or None. Stored as one JSON user attribute
    (:data:`OUTCOME_ATTR`) that each run replaces.
    """
    from dataclasses import asdict

    presets = []
    for b in baselines:
        ev = b.evaluation
        entry: dict[str, Any] = {"name": b.name, "error": b.error}
        if ev is not None:
            m = ev.metrics.to_dict()
            entry.update(
                feasible=bool(ev.feasible),
                violations=dict(ev.violations),
                metrics={k: _finite(m.get(k)) for k in (*TRIAL_METRICS, "hit_ratio_tokens")},
            )
        presets.append(entry)
    outcome = {
        "presets": presets,
        "tiered": None if tiered is None else _finite(asdict(tiered)),
        "hbm_only": None if hbm_only is None else _finite(asdict(hbm_only)),
    }
    study.set_user_attr(OUTCOME_ATTR, outcome)


def _finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float made None (JSON storage has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def make_objective(
    evaluator: Evaluator, space: SearchSpace, *, pareto: bool
) -> Callable[[optuna.Trial], Any]:
    def objective(trial: optuna.Trial) -> Any:
        if evaluator.objective != "cost":  # the first objective's name says what it is
            name_metrics(trial.study, pareto=pareto, objective=evaluator.objective)
        values = space.suggest(trial)
        try:
            ev = evaluator.evaluate(values)
        except InputError as err:  # an impossible combination (e.g. the model does not fit)
            trial.set_user_attr("error", str(err))
            raise optuna.TrialPruned(str(err)) from None
        record(trial, ev)
        value = ev.objective_value  # cost per 1M tokens, or joules per token
        cost = value if math.isfinite(value) else 1e18
        if pareto:
            p99 = ev.metrics.ttft_p99_s
            return cost, (p99 if math.isfinite(p99) else 1e18)
        return cost

    return objective


@dataclass(frozen=True)
class TrialSummary:
    number: int
    params: dict[str, Any]
    policy: dict[str, Any]
    metrics: dict[str, Any]
    violations: dict[str, float]
    feasible: bool
    rate_scale: float


def summaries(study: optuna.Study) -> list[TrialSummary]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "metrics" not in t.user_attrs:
            continue
        a = t.user_attrs
        out.append(
            TrialSummary(
                t.number,
                a["params"],
                a["policy"],
                a["metrics"],
                a["violations"],
                bool(a["feasible"]),
                float(a["rate_scale"]),
            )
        )
    return out


@dataclass(frozen=True)
class Tally:
    """How many trials of a study ran to the end with metrics, and how many met the SLO."""

    finished: int
    feasible: int


def tally(study: optuna.Study) -> Tally:
    done = summaries(study)
    return Tally(len(done), sum(s.feasible for s in done))


def study_objective(study: optuna.Study) -> str:
    """What ``study`` minimises (its setup's ``objective``; "cost" when it records none)."""
    return str((study.user_attrs.get(SETUP_ATTR) or {}).get("objective", "cost"))


def best_feasible(study: optuna.Study) -> TrialSummary | None:
    """The trial that meets the SLO at the least of the study's objective (cost per token, or
    joules per token; ties: the earlier trial)."""
    feasible = [s for s in summaries(study) if s.feasible]
    if not feasible:
        return None
    key = objective_metric(study_objective(study))

    def value(s: TrialSummary) -> float:
        v = s.metrics.get(key)
        return math.inf if v is None else float(v)

    return min(feasible, key=lambda s: (value(s), s.number))


def closest(study: optuna.Study, slo_bounds: dict[str, float]) -> TrialSummary | None:
    """The trial that misses the SLO by the least (relative violations summed)."""

    def miss(s: TrialSummary) -> float:
        total = 0.0
        for term, v in s.violations.items():
            if v > 0:
                total += v / slo_bounds[term] if slo_bounds.get(term) else v
        return total

    done = summaries(study)
    return min(done, key=lambda s: (miss(s), s.number)) if done else None


def pareto_front(study: optuna.Study) -> list[TrialSummary]:
    """Feasible trials not dominated on (cost per token, TTFT P99)."""
    points = [s for s in summaries(study) if s.feasible]
    front = []
    for s in points:
        c, t = s.metrics["cost_per_mtok"], s.metrics["ttft_p99_s"]
        if not any(
            o.metrics["cost_per_mtok"] <= c
            and o.metrics["ttft_p99_s"] <= t
            and (o.metrics["cost_per_mtok"] < c or o.metrics["ttft_p99_s"] < t)
            for o in points
        ):
            front.append(s)
    return sorted(front, key=lambda s: s.metrics["cost_per_mtok"])
