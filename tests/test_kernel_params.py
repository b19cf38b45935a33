"""numba kernels take at most eight parameters: the serving engine's steps take bundled
state (:mod:`kvtier.sim.nb_state`, :mod:`kvtier.sim.nb_tiers`), the cache engine's kernels and
policy hooks one tier's arrays as a :class:`kvtier.cache.nb_state.TierArrays`, and the
plug-ins' twins the same. ``KNOWN`` lists exceptions and may only shrink: it is empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "optimizer"
LIMIT = 8

# (module, kernel) -> its parameter count today; not yet bundled
KNOWN: dict[tuple[str, str], int] = {}


def kernels(path: Path) -> list[tuple[str, int]]:
    """Every function of ``path`` decorated with numba's ``njit``, and its parameter count."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and any(
            "njit" in ast.unparse(d) for d in node.decorator_list
        ):
            out.append((node.name, len(node.args.args)))
    return out


def test_no_kernel_over_the_limit_but_the_known_ones() -> None:
    over = {}
    for path in sorted(SOURCE.rglob("*.py")):
        rel = path.relative_to(SOURCE).as_posix()
        for name, count in kernels(path):
            if count > LIMIT:
                over[(rel, name)] = count
    new = {k: v for k, v in over.items() if k not in KNOWN or v > KNOWN[k]}
    assert new == {}
    gone = sorted(k for k in KNOWN if k not in over)
    assert gone == [], f"bundled since: drop them from KNOWN: {gone}"


def test_the_serving_steps_take_the_bundle() -> None:
    sim = SOURCE / "sim"
    over = [(p.name, n, c) for p in sorted(sim.rglob("*.py")) for n, c in kernels(p) if c > LIMIT]
    assert over == []


def test_the_count_sees_a_kernel(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("@njit(cache=True)\ndef f_nb(a, b, c):\n    return a\n")
    assert kernels(module) == [("f_nb", 3)]
