"""An enqueued trial is claimed by exactly one worker, however many ask for it at once.

Optuna's own claim reads the trial's state and then writes RUNNING; on SQLite its row lock is
a plain read, so two workers could both claim one waiting trial, both run it, and the second
then crashed reporting it ("Cannot tell a COMPLETE trial").
"""

from __future__ import annotations

import threading

import optuna
import pytest

from kvtier.search.study import study_storage

CLAIMANTS = 6
ROUNDS = 15


def test_each_waiting_trial_is_claimed_once(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'claim.db'}"
    owner = study_storage(url)
    study = optuna.create_study(storage=owner, study_name="claim")
    for i in range(ROUNDS):
        study.enqueue_trial({"x": float(i)})
    waiting = [t._trial_id for t in study.get_trials(deepcopy=False)]
    # each claimant has its own storage, hence its own connections, as separate workers do
    storages = [study_storage(url) for _ in range(CLAIMANTS)]
    wins = {trial_id: 0 for trial_id in waiting}
    lock = threading.Lock()

    for trial_id in waiting:
        start = threading.Barrier(CLAIMANTS)

        def claim(storage, trial_id=trial_id, start=start) -> None:
            start.wait()
            if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING):
                with lock:
                    wins[trial_id] += 1

        threads = [threading.Thread(target=claim, args=(s,)) for s in storages]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert set(wins.values()) == {1}
    states = {t.state for t in study.get_trials(deepcopy=False)}
    assert states == {optuna.trial.TrialState.RUNNING}


# ask/tell on a heartbeat storage outside Study.optimize: Optuna says so, as expected here
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used:UserWarning")
def test_claiming_a_finished_trial_is_refused_not_raised(tmp_path) -> None:
    storage = study_storage(f"sqlite:///{tmp_path / 'done.db'}")
    study = optuna.create_study(storage=storage, study_name="done")
    study.enqueue_trial({"x": 1.0})
    trial = study.ask()  # claims the waiting trial
    study.tell(trial, 1.0)
    assert not storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.RUNNING)
    with pytest.raises(KeyError):
        storage.set_trial_state_values(10_000, optuna.trial.TrialState.RUNNING)
