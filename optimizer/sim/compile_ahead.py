"""Compile the event loop's callees in a second process while the first one prepares.

numba compiles a kernel, and every kernel it calls that is not yet compiled, in one thread. A
replay from an empty kernel cache spends about a minute of one core there (docs/benchmarks.md,
"The README's first command"): typing ``event_loop_nb`` reaches its out-of-line callees one
after the other (``admit_nb``, ``computed_nb``, ``faults_advance_nb``...), compiling each as it
comes, then lowers the loop itself. On a machine with a second core, :func:`start` launches
this module as a child process as soon as a command knows it will replay. The child builds
the state of a two-request replay in Python (:func:`kvtier.sim.nb.new_state`: the same code
the kernel inlines, so the same numba types), and compiles the callees with those types, in
the reverse of the order the parent's typing reaches them, each into numba's on-disk cache.
When the parent's typing reaches a callee the child has finished, numba loads it from the cache
instead of compiling it; where the two meet, at most one callee is compiled twice.

The child only fills the cache: the parent compiles whatever it does not find there, so a
replay's result never depends on the child (killed, slow, or not started). The types are
checked against the ones the event loop really compiles (tests/test_compile_ahead.py), so a
changed kernel signature fails a test rather than silently wasting the child's work.

Off with ``KVTIER_COMPILE_AHEAD=0``; never started on a single core, with numba's JIT
disabled, or when the replay kernel is already in the cache.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.sim.nb_state import Sim

ENV = "KVTIER_COMPILE_AHEAD"

_child: subprocess.Popen | None = None
_asked = False  # (whether this process has decided; the check reads one file)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def wanted() -> bool:
    """Whether a child would help: two cores or more, JIT on, not switched off, and the
    replay kernel not in numba's cache (its index file absent: a first run, or sources that
    changed since, whose indexes :mod:`kvtier.jitcache` dropped)."""
    if os.environ.get(ENV, "1") == "0" or os.environ.get("NUMBA_DISABLE_JIT", "0") != "0":
        return False
    if _cores() < 2:
        return False
    from kvtier.sim.nb import simulate_nb

    cache_file = getattr(simulate_nb._cache, "_cache_file", None)  # numba's FunctionCache
    index = getattr(cache_file, "_index_path", None)
    return index is not None and not os.path.exists(index)


def start() -> bool:
    """Launch the child if :func:`wanted`; it is terminated when this process exits. Returns
    whether one was launched."""
    global _child, _asked
    if _asked:
        return False
    _asked = True
    if not wanted():
        return False
    try:
        _child = subprocess.Popen(
            [sys.executable, "-m", "kvtier.sim.compile_ahead"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **{ENV: "0"}),  # (the child never starts one of its own)
        )
    except OSError:  # (no interpreter to start, no process left): the parent compiles alone
        return False
    atexit.register(stop)
    return True


def stop() -> None:
    """Terminate the child if it still runs (its last write, if any, is atomic in numba)."""
    global _child
    if _child is not None and _child.poll() is None:
        _child.terminate()
        try:
            _child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _child.kill()
    _child = None


def sample_state() -> Sim:
    """The state of a two-request replay on two instances, built in Python by the code the
    kernel runs (:func:`kvtier.sim.engine.kernel_inputs`, :func:`kvtier.sim.nb.new_state`);
    only its types matter."""
    import numpy as np

    from kvtier.sim.config import SimConfig
    from kvtier.sim.engine import kernel_inputs
    from kvtier.sim.nb import new_state
    from kvtier.trace.blocked import BlockedTrace

    trace = BlockedTrace(
        arrival_s=np.array([0.0, 1.0]),
        input_tokens=np.array([40, 40], dtype=np.int64),
        output_tokens=np.array([4, 4], dtype=np.int64),
        block_offsets=np.array([0, 2, 4], dtype=np.int64),
        block_ids=np.array([0, 1, 0, 1], dtype=np.int32),
        n_blocks=2,
        block_tokens=16,
    )
    cfg = SimConfig(
        n_instances=2,
        capacity_blocks=16,
        block_tokens=16,
        token_budget=64,
        max_seqs=4,
        router=0,
        affinity_overload=0,
        flops_per_token=1e9,
        attn_coef=1e3,
        compute_rate=1e15,
        weight_bytes=1e9,
        kv_bytes_per_token=1e5,
        mem_rate=1e12,
        step_overhead_s=1e-3,
        cost_per_hour=1.0,
        scheduler=1,
    )
    for column in (trace.input_tokens, trace.output_tokens):
        column.flags.writeable = False  # as a trace read from Parquet holds them (Arrow's)
    rq, prm, pool, ts, tp, lk, out, _ = kernel_inputs(trace, cfg)
    return new_state(rq, prm, pool, ts, tp, lk, out)


def plan() -> list[tuple[Any, Callable[[Sim], tuple]]]:
    """The event loop's out-of-line callees, each with arguments of the types its call site
    passes (``0`` types as int64, ``0.0`` as float64), in the reverse of the order the loop's
    typing reaches them (measured with numba's compile events; the first are the last it
    reaches)."""
    import numpy as np

    from kvtier.sim import nb
    from kvtier.sim.fault_step import faults_advance_nb
    from kvtier.sim.nb_hbm import Run, hbm_cache_generated_nb, hbm_register_nb, hbm_release_nb
    from kvtier.sim.nb_tbt import tbt_run_nb, tbt_tail_nb, tbt_token_nb
    from kvtier.sim.nb_tiers import computed_nb
    from kvtier.sim.routers.dispatch import route_nb

    f8 = np.zeros(1, dtype=np.float64)
    i8 = np.zeros(1, dtype=np.int64)
    i4 = np.zeros(1, dtype=np.int32)
    return [
        (nb.admit_nb, lambda s: (s, 0, 0, 0.0, 0, False, 0.0, 0)),
        (nb.preempt_nb, lambda s: (0, 0, s.rq, s.rs, s.ist, s.pool, s.prm, s.out)),
        (nb.grow_nb, lambda s: (s, 0, 0, 0, 0.0)),
        (nb.release_held_nb, lambda s: (0, 0.0, s.rs, s.ist, s.pool, s.prm)),
        (route_nb, lambda s: (s, 0)),
        (nb.stop_early_nb, lambda s: (0.0, s.ist, s.prm, s.out, s.ty)),
        (hbm_release_nb, lambda s: (s.pool, i8, i8, i8, 0, 0, 0, 0)),
        (hbm_cache_generated_nb, lambda s: (s.pool.records, s.pool.slots, 0, 0)),
        (tbt_run_nb, lambda s: (0, f8, 0, f8, i8, i8, f8)),
        (tbt_tail_nb, lambda s: (0, f8, i8, i8)),
        (tbt_token_nb, lambda s: (0, 0.0, f8, i8, i8, f8)),
        (nb.hand_off_nb, lambda s: (s, 0, 0, 0.0)),
        (nb.seen_first_nb, lambda s: (0, s.rq, s.rs, s.prm, s.out, s.ty)),
        (computed_nb, lambda s: (s.ts, s.tp, s.lk, 0, 0.0, i4, 0)),
        (hbm_register_nb, lambda s: (s.pool, s.rq, 0, 0, Run(0, 0, 0), i4, 0, 0)),
        (faults_advance_nb, lambda s: (s.ts, 0.0)),
    ]


def signatures(sim: Sim) -> list[tuple[Any, tuple]]:
    """:func:`plan` as (dispatcher, numba argument types)."""
    from numba import typeof

    return [(d, tuple(typeof(a) for a in args(sim))) for d, args in plan()]


def compile_all() -> None:
    """Compile every callee of :func:`plan` into numba's cache, in order."""
    for dispatcher, sig in signatures(sample_state()):
        dispatcher.compile(sig)


if __name__ == "__main__":
    compile_all()
