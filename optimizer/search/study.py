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
from kvtier.search.objective import Evaluation, Evaluator
from kvtier.search.space import SearchSpace

RUNS_DIR = Path("runs")


def default_storage(study_name: str, runs_dir: Path = RUNS_DIR) -> str:
    runs_dir.mkdir(parents=True, exist_ok=True)
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


def study_storage(url: str) -> str | optuna.storages.RDBStorage:
    """The storage to hand to Optuna: the URL itself, or for SQLite an ``RDBStorage`` whose
    connections use write-ahead logging (see :func:`_sqlite_pragmas`)."""
    if not url.startswith("sqlite"):
        return url
    rdb = optuna.storages.RDBStorage(url)
    sqlalchemy.event.listen(rdb.engine, "connect", _sqlite_pragmas)
    rdb.engine.dispose()  # connections made while creating the schema lack the pragmas
    return rdb


def open_study(study_name: str, *, storage: str | None, seed: int, pareto: bool) -> optuna.Study:
    """Create the study, or load it to continue when it exists.

    Many workers (``optimize`` on many machines) may open one study on a shared database at
    the same moment. Optuna creates the schema and the study on first use, and concurrent
    creators can collide (a unique-constraint violation or a table that already exists on
    PostgreSQL, "database is locked" on SQLite); the loser retries after a short random wait
    and then finds both in place.
    """
    url = storage or default_storage(study_name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
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
            optuna.exceptions.OptunaError,
            sqlalchemy.exc.SQLAlchemyError,
        ) as err:
            raise storage_error(study_name, url, err) from None
    if len(study.directions) != len(directions):
        raise InputError(
            f"study {study_name!r} exists with {len(study.directions)} objective(s); "
            f"{'--pareto needs' if pareto else 'a single-objective run needs'} a new --study name",
            option="--study",
        )
    return study


def _creation_race(err: Exception) -> bool:
    """Did ``err`` come from another worker creating the same schema or study just now?"""
    if isinstance(err, sqlalchemy.exc.IntegrityError | optuna.exceptions.DuplicatedStudyError):
        return True
    text = str(err).lower()
    return "already exists" in text or "database is locked" in text


def storage_error(study_name: str, url: str, err: Exception) -> InputError:
    """A storage failure as one line: the database's own first line, and the driver to
    install when one is missing."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, ImportError) and url.startswith("postgresql"):
        first += " (pip install 'kvtier[postgres]')"
    return InputError(f"cannot open study {study_name!r} at {url}: {first}", option="--storage")


def record(trial: optuna.Trial, ev: Evaluation) -> None:
    trial.set_user_attr("params", ev.values)
    trial.set_user_attr("policy", policy_to_dict(ev.policy))
    trial.set_user_attr("metrics", ev.metrics.to_dict())
    trial.set_user_attr("violations", ev.violations)
    for key, value in zip(ev.violations, ev.constraints(), strict=True):
        trial.set_constraint(key, value)  # <= 0 is satisfied; the samplers read these
    trial.set_user_attr("feasible", ev.feasible)
    trial.set_user_attr("rate_scale", ev.rate_scale)
    trial.set_user_attr("replays", ev.replays)


def make_objective(
    evaluator: Evaluator, space: SearchSpace, *, pareto: bool
) -> Callable[[optuna.Trial], Any]:
    def objective(trial: optuna.Trial) -> Any:
        values = space.suggest(trial)
        try:
            ev = evaluator.evaluate(values)
        except InputError as err:  # an impossible combination (e.g. the model does not fit)
            trial.set_user_attr("error", str(err))
            raise optuna.TrialPruned(str(err)) from None
        record(trial, ev)
        cost = ev.cost_per_mtok if math.isfinite(ev.cost_per_mtok) else 1e18
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


def best_feasible(study: optuna.Study) -> TrialSummary | None:
    """Cheapest trial per token that meets the SLO (ties: the earlier trial)."""
    feasible = [s for s in summaries(study) if s.feasible]
    if not feasible:
        return None
    return min(feasible, key=lambda s: (s.metrics["cost_per_mtok"], s.number))


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
