"""Each finished trial counts for exactly one worker, the last that started it."""

from __future__ import annotations

import optuna

from kvtier.search.run import WORKER_ATTR, _ran_by


def test_a_trial_two_workers_took_counts_once() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for starter, value in (("a", 1.0), ("b", 2.0)):
        t = study.ask()
        t.set_user_attr(WORKER_ATTR, starter)
        study.tell(t, value)
    # a trial both took from the queue: each wrote its name as it started, the last one stays
    shared = study.ask()
    shared.set_user_attr(WORKER_ATTR, "a")
    shared.set_user_attr(WORKER_ATTR, "b")
    study.tell(shared, 3.0)
    # a retry waiting in the queue with the name copied from its failed original: not run yet
    study.enqueue_trial({}, user_attrs={WORKER_ATTR: "a"})
    assert (_ran_by(study, "a"), _ran_by(study, "b")) == (1, 2)
    assert _ran_by(study, "a") + _ran_by(study, "b") == len(study.get_trials()) - 1
