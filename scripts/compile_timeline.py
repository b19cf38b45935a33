"""Where a kvtier command's time goes while numba compiles: each kernel's compile, when.

Runs one kvtier command in this process (``kvtier.cli.main``) with a listener on numba's
``numba:compile`` events, and prints after it: the wall and CPU time of the whole command, the
compile time of each kernel compiled at the top level (the one a Python call asked for, its
callees' compiles included), the exclusive and inclusive compile time of each kernel (its
callees' compiles taken out, or not) with how many overloads it compiled, and the order in
which the top three levels started. A kernel loaded from numba's cache emits no event, so
with ``kvtier.sim.compile_ahead``'s child running, the callees it compiled first are absent.

Run it with an empty numba cache to see a first run (``NUMBA_CACHE_DIR`` a new folder):

    NUMBA_CACHE_DIR=$(mktemp -d) python scripts/compile_timeline.py optimize \\
        --trace traces/sample-multiround-qa.parquet --quiet
"""

from __future__ import annotations

import collections
import sys
import time

T0 = time.perf_counter()
C0 = time.process_time()

from numba.core import event  # noqa: E402

Record = tuple[str, int, str, float]  # start/end, depth, kernel, seconds since start
LOG: list[Record] = []
_depth = [0]


def _name(ev: event.Event) -> str:
    f = ev.data["dispatcher"].py_func
    return f"{f.__module__}.{f.__qualname__}"


class _Listener(event.Listener):
    def on_start(self, ev: event.Event) -> None:
        _depth[0] += 1
        LOG.append(("s", _depth[0], _name(ev), time.perf_counter() - T0))

    def on_end(self, ev: event.Event) -> None:
        LOG.append(("e", _depth[0], _name(ev), time.perf_counter() - T0))
        _depth[0] -= 1


def report(out: object = sys.stderr) -> None:
    """Print the figures described in the module's docstring."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"command: {time.perf_counter() - T0:.1f} s wall, {time.process_time() - C0:.1f} s CPU")
    stack: list[list] = []
    top: dict[str, float] = collections.defaultdict(float)
    own: dict[str, float] = collections.defaultdict(float)
    whole: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    order: list[tuple[float, float, int, str]] = []
    for kind, depth, name, t in LOG:
        if kind == "s":
            stack.append([name, t, 0.0, depth])
            continue
        name, t0, inner, d = stack.pop()
        dt = t - t0
        own[name] += dt - inner
        whole[name] += dt
        count[name] += 1
        if stack:
            stack[-1][2] += dt
        else:
            top[name] += dt
        if d <= 3:
            order.append((t0, dt, d, name))
    p(f"compile at the top level: {sum(top.values()):.1f} s")
    for name, dt in sorted(top.items(), key=lambda r: -r[1]):
        if dt >= 0.1:
            p(f"  {dt:7.1f}  {name}")
    p("kernel compile, exclusive / inclusive s, overloads:")
    for name, dt in sorted(own.items(), key=lambda r: -r[1])[:40]:
        p(f"  {dt:7.1f} {whole[name]:7.1f} {count[name]:3d}  {name}")
    p("start (s since the command began), inclusive s, level, kernel:")
    for t0, dt, d, name in sorted(order):
        if dt >= 0.3:
            p(f"  {t0:7.1f} {dt:7.1f}  {d}  {name}")


def main() -> None:
    event.register("numba:compile", _Listener())
    from kvtier.cli import main as kvtier_main

    try:
        kvtier_main(sys.argv[1:], standalone_mode=False)
    except SystemExit:
        pass
    finally:
        report()


if __name__ == "__main__":
    main()
