"""numba kernels take few parameters: the serving engine's steps take one bundled state
(:class:`kvtier.sim.nb_state.Sim`) and the plug-ins' twins take it too.

The cache engine's kernels and policy hooks take one tier's arrays as a
:class:`kvtier.cache.nb_state.TierArrays`. The per-block primitives of the HBM pools and the
lower tiers' kernels still take more than eight (each is handed only the arrays it touches,
which the hot loops were tuned on), as do the cache engine's two unbundled entry points that
those kernels call with one pool's arrays; they are listed here and the list may only shrink:
a new kernel over the limit, or one of these growing, fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "optimizer"
LIMIT = 8

# (module, kernel) -> its parameter count today; not yet bundled
KNOWN = {
    ("cache/nb.py", "_access_nb"): 10,
    ("cache/nb.py", "remove_nb"): 9,
    ("sim/nb_hbm.py", "hbm_take_nb"): 13,
    ("sim/nb_hbm.py", "hbm_register_nb"): 13,
    ("sim/nb_hbm.py", "hbm_release_nb"): 10,
    ("sim/nb_tiers.py", "load_cost_nb"): 9,
    ("sim/nb_tiers.py", "load_nb"): 14,
    ("sim/nb_tiers.py", "write_down_nb"): 9,
    ("sim/nb_tiers.py", "sighted_nb"): 11,
}


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
    steps = [sim / "nb.py", *sorted(sim.glob("routers/*.py")), *sorted(sim.glob("load_rules/*.py"))]
    over = [(p.name, n, c) for p in steps for n, c in kernels(p) if c > LIMIT]
    assert over == []


def test_the_count_sees_a_kernel(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("@njit(cache=True)\ndef f_nb(a, b, c):\n    return a\n")
    assert kernels(module) == [("f_nb", 3)]
