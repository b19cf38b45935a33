"""Check that two revisions of kvtier print and write the same bytes.

A reshaping of the package (modules moved, functions split, one helper in place of copies)
must leave every result as it was. This script checks it end to end: it checks out ``BASE``
(and ``HEAD``, else takes the working tree) into temporary ``git worktree`` folders, makes
each importable as ``kvtier`` (a folder holding only a symlink ``kvtier -> <tree>/optimizer``,
first on ``PYTHONPATH``; ``kvtier.builtin`` resolves it to find that tree's ``policies/``),
and runs one fixed list of commands with each: ``replay --json`` on every bundled trace
under the default policy and a few presets (one writing ``--requests-out``), ``compare``,
``optimize --seed`` with a few trials (then ``export --target all`` of the policy file it
wrote and of the presets), and ``validate``. Each revision runs the commands in turn in one
interpreter of its own (through ``kvtier.cli.main``, stdout and stderr captured), so the
kernels compile once per revision rather than once per command. Both revisions run in the
same folder (so paths printed or recorded are the same), with the same environment and each
with an empty numba cache of its own (``NUMBA_CACHE_DIR``), so a kernel compiled from one
revision's sources is never loaded by the other.

It then compares, command by command, the exit code, stdout, stderr and every file written
(study databases excepted: SQLite files hold timestamps; what a study holds shows in the
commands' output), after masking the few figures that are wall-clock times (optimize's
``seconds``) and writing each revision's source folder as ``<tree>`` (a policy file records
the path of its search space). It prints each output that differs with the first differing
lines and exits 1 when any does, 0 when all are the same.

Most of a run is compiling the kernels, once per revision (one to several minutes on a
shared 2-core machine); after that each command takes 0.1 to 10 s, except ``validate pd``
(its capacity searches: minutes), left out unless asked for with ``--slow``. ``--list``
prints the commands with whether each is slow; ``--only TEXT`` keeps the commands whose name
holds TEXT.

Usage: ``python scripts/same_output.py BASE [HEAD] [--slow] [--only TEXT] [--keep]
[--list]``, with the Python of an environment where kvtier's dependencies are installed
(the repository's ``.venv``). ``BASE`` and ``HEAD`` are any git revisions.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """One command: its name, the arguments after ``kvtier``, and whether it is slow."""

    name: str
    args: tuple[str, ...]
    slow: bool = False
    # regular expressions whose matches are wall-clock figures, replaced before comparing
    masks: tuple[str, ...] = ()


TRACES = ("sample-chat", "sample-rag", "mooncake-conversation", "sample-multiround-qa")
REPLAY_PRESETS = ("beluga-cxl", "lmcache-cpu-disk", "mooncake-pd")
EXPORT_PRESETS = ("vllm-hbm", "lmcache-cpu-disk", "mooncake-rdma", "dynamo-disagg")
# optimize's wall-clock time: "seconds" in --json, "N in all, T s;" in its text report
OPTIMIZE_MASKS = (r'"seconds": [-+0-9.eE]+', r"in all, [0-9.,]+ s;")


def cases() -> list[Case]:
    """The commands both revisions run, in order (later ones read files earlier ones wrote)."""
    out: list[Case] = []
    for trace in TRACES:
        path = f"traces/{trace}.parquet"
        out.append(Case(f"replay {trace}", ("replay", "--trace", path, "--json")))
        for preset in REPLAY_PRESETS:
            out.append(
                Case(
                    f"replay {trace} --preset {preset}",
                    ("replay", "--trace", path, "--preset", preset, "--json"),
                )
            )
    out += [
        Case(
            "replay sample-chat table, --requests-out",
            (
                "replay",
                "--trace",
                "traces/sample-chat.parquet",
                "--preset",
                "beluga-cxl",
                "--requests-out",
                "out/requests.parquet",
            ),
        ),
        Case(
            "replay sample-chat --track-tbt --rate-scale 2 --concurrency 64",
            (
                "replay",
                "--trace",
                "traces/sample-chat.parquet",
                "--track-tbt",
                "--rate-scale",
                "2",
                "--concurrency",
                "64",
                "--json",
            ),
        ),
        Case(
            "replay sample-chat --engine reference",
            ("replay", "--trace", "traces/sample-chat.parquet", "--engine", "reference", "--json"),
        ),
        Case(
            "compare sample-chat --json",
            ("compare", "--trace", "traces/sample-chat.parquet", "--slo", "ttft_p99=2", "--json"),
        ),
        Case(
            "compare sample-rag table --what-if",
            (
                "compare",
                "--trace",
                "traces/sample-rag.parquet",
                "--preset",
                "beluga-cxl",
                "--preset",
                "vllm-hbm",
                "--what-if",
                "--track-tbt",
            ),
        ),
        Case(
            "optimize sample-chat --seed 3 --trials 6 --json",
            (
                "optimize",
                "--trace",
                "traces/sample-chat.parquet",
                "--seed",
                "3",
                "--trials",
                "6",
                "--study",
                "same-output",
                "--storage",
                "sqlite:///out/same-output.db",
                "--out",
                "out/best.toml",
                "--json",
            ),
            masks=OPTIMIZE_MASKS,
        ),
        Case(
            "optimize sample-rag --load capacity (table)",
            (
                "optimize",
                "--trace",
                "traces/sample-rag.parquet",
                "--seed",
                "5",
                "--trials",
                "4",
                "--load",
                "capacity",
                "--study",
                "same-output-capacity",
                "--storage",
                "sqlite:///out/same-output-capacity.db",
                "--out",
                "out/capacity.toml",
                "--no-presets",
            ),
            masks=OPTIMIZE_MASKS,
        ),
        Case(
            "replay of optimize's policy file",
            ("replay", "--trace", "traces/sample-chat.parquet", "--policy", "out/best.toml"),
        ),
        Case(
            "export optimize's policy file --target all",
            ("export", "out/best.toml", "--target", "all"),
        ),
        Case(
            "export optimize's policy file --target all -o, --json",
            ("export", "out/best.toml", "--target", "all", "-o", "out/export-best", "--json"),
        ),
    ]
    for preset in EXPORT_PRESETS:
        out.append(
            Case(
                f"export {preset} --target all -o",
                (
                    "export",
                    f"policies/presets/{preset}.toml",
                    "--target",
                    "all",
                    "-o",
                    f"out/export-{preset}",
                ),
            )
        )
    out += [
        Case(
            "validate beluga --json --markdown",
            ("validate", "beluga", "--json", "--markdown", "out/validation.md"),
        ),
        Case("validate beluga (text)", ("validate", "beluga")),
        Case(
            "validate serving --json --markdown",
            ("validate", "serving", "--json", "--markdown", "out/validation-serving.md"),
        ),
        Case(
            "validate pd --json --markdown",
            ("validate", "pd", "--json", "--markdown", "out/validation-pd.md"),
            slow=True,
        ),
    ]
    return out


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def prepare_tree(rev: str | None, scratch: Path, label: str) -> tuple[Path, str]:
    """The source tree of ``rev`` (a temporary worktree; the working tree for None) and a
    description of it."""
    if rev is None:
        return REPO, "the working tree"
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        print(f"error: {rev!r} names no commit of {REPO}", file=sys.stderr)
        raise SystemExit(2) from None
    tree = scratch / f"tree-{label}"
    git("worktree", "add", "--detach", "--quiet", str(tree), commit)
    return tree, f"{rev} ({commit[:10]})"


# Runs in each revision's interpreter: every command in turn through ``kvtier.cli.main``, as
# ``kvtier ARGS`` would, with stdout and stderr captured, numba compiled once per revision.
RUNNER = r"""
import io, json, sys, time, traceback
from contextlib import redirect_stderr, redirect_stdout
from kvtier.cli import main
cases = json.load(open(sys.argv[1]))
results = {}
for name, args in cases:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    started = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(args, prog_name="kvtier")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = -1
    seconds = time.perf_counter() - started
    texts = []
    for stream in (out, err):
        stream.flush()
        texts.append(stream.buffer.getvalue().decode("utf-8", "replace"))
    results[name] = {"code": code, "stdout": texts[0], "stderr": texts[1], "seconds": seconds}
    print(f"  {name}: exit {code}, {seconds:.1f} s", file=sys.__stdout__, flush=True)
json.dump(results, open(sys.argv[2], "w"))
"""


def run_revision(
    tree: Path, label: str, scratch: Path, run_dir: Path, selected: list[Case]
) -> dict[str, Outcome]:
    """Run every selected command with the package of ``tree``, in ``run_dir``, in one
    interpreter; the folder is then moved aside so the other revision runs in the same path."""
    importable = scratch / f"import-{label}"
    importable.mkdir()
    (importable / "kvtier").symlink_to(tree / "optimizer", target_is_directory=True)
    numba_cache = scratch / f"numba-{label}"
    numba_cache.mkdir()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    (run_dir / "out").mkdir()
    shutil.copytree(tree / "traces", run_dir / "traces")
    (run_dir / "policies").symlink_to(tree / "policies", target_is_directory=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(importable),
        "NUMBA_CACHE_DIR": str(numba_cache),
        "COLUMNS": "160",
        "PYTHONHASHSEED": "0",
        "TERM": "dumb",
    }
    for key in ("NO_COLOR", "FORCE_COLOR", "KVTIER_PRESET_PATH", "KVTIER_PROFILE_PATH"):
        env.pop(key, None)
    where = subprocess.run(
        [sys.executable, "-c", "import kvtier, os; print(os.path.realpath(kvtier.__file__))"],
        env=env,
        cwd=run_dir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).is_relative_to(tree.resolve()):
        sys.exit(f"kvtier imports from {where}, not from {tree}: is PYTHONPATH overridden?")
    cases_file, results_file = scratch / f"cases-{label}.json", scratch / f"results-{label}.json"
    cases_file.write_text(json.dumps([[c.name, list(c.args)] for c in selected]))
    runner = scratch / "runner.py"
    runner.write_text(RUNNER)
    subprocess.run(
        [sys.executable, str(runner), str(cases_file), str(results_file)],
        env=env,
        cwd=run_dir,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    results = {
        name: Outcome(
            r["code"],
            without_tree(r["stdout"], tree),
            without_tree(r["stderr"], tree),
            r["seconds"],
        )
        for name, r in json.loads(results_file.read_text()).items()
    }
    os.replace(run_dir, scratch / f"out-{label}")
    return results


def without_tree(text: str, tree: Path) -> str:
    """``text`` with the revision's source folder written ``<tree>``: each revision runs from a
    folder of its own, which a policy file records (the search space's path)."""
    for path in dict.fromkeys((str(tree.resolve()), str(tree))):
        text = text.replace(path, "<tree>")
    return text


def masked(text: str, case: Case) -> str:
    for pattern in case.masks:
        text = re.sub(pattern, "<masked>", text)
    return text


def first_lines_differing(a: str, b: str, limit: int = 12) -> str:
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "base", "head", lineterm="", n=1)
    lines = list(diff)
    more = f"\n      ... {len(lines) - limit} more lines" if len(lines) > limit else ""
    return "\n".join(f"      {line[:200]}" for line in lines[:limit]) + more


def compare_outcomes(
    selected: list[Case], base: dict[str, Outcome], head: dict[str, Outcome]
) -> list[str]:
    differences = []
    for case in selected:
        a, b = base[case.name], head[case.name]
        if a.code != b.code:
            differences.append(f"{case.name}: exit code {a.code} vs {b.code}")
        for stream in ("stdout", "stderr"):
            x, y = masked(getattr(a, stream), case), masked(getattr(b, stream), case)
            if x != y:
                differences.append(f"{case.name}: {stream}\n{first_lines_differing(x, y)}")
    return differences


def compare_files(
    base_dir: Path, head_dir: Path, trees: tuple[Path, Path], selected: list[Case]
) -> list[str]:
    """Every file written under ``out/`` by either revision, compared (with each revision's
    source folder written ``<tree>``, and masked as the commands are)."""
    masks = tuple(m for c in selected for m in c.masks)
    names = sorted(
        {
            p.relative_to(d).as_posix()
            for d in (base_dir, head_dir)
            for p in (d / "out").rglob("*")
            if p.is_file() and not p.name.endswith(".db")
        }
    )
    differences = []
    for name in names:
        a, b = base_dir / name, head_dir / name
        if not a.exists() or not b.exists():
            differences.append(f"file {name}: written by {'head' if b.exists() else 'base'} only")
        elif not filecmp.cmp(a, b, shallow=False):
            try:
                x, y = a.read_text(), b.read_text()
            except UnicodeDecodeError:
                differences.append(f"file {name}: binary contents differ")
                continue
            mask_case = Case("", (), masks=masks)
            x = masked(without_tree(x, trees[0]), mask_case)
            y = masked(without_tree(y, trees[1]), mask_case)
            if x != y:
                differences.append(f"file {name}\n{first_lines_differing(x, y)}")
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the revision to compare against (e.g. 5d30638)")
    parser.add_argument("head", nargs="?", default=None, help="[default: the working tree]")
    parser.add_argument("--slow", action="store_true", help="also run the slow commands")
    parser.add_argument("--only", default=None, help="only the commands whose name holds this")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--list", action="store_true", help="list the commands and stop")
    args = parser.parse_args(argv)

    selected = [
        c
        for c in cases()
        if (args.slow or not c.slow) and (args.only is None or args.only in c.name)
    ]
    if args.list:
        for c in cases():
            print(f"{'slow ' if c.slow else '     '} {c.name}: kvtier {' '.join(c.args)}")
        return 0
    if not selected:
        print("no command selected", file=sys.stderr)
        return 2
    # a SIGTERM unwinds like Ctrl-C, so the temporary worktrees are removed either way
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-same-output-"))
    trees: list[Path] = []
    try:
        outcomes = []
        sources = []
        for label, rev in (("base", args.base), ("head", args.head)):
            tree, what = prepare_tree(rev, scratch, label)
            sources.append(tree)
            if rev is not None:
                trees.append(tree)
            print(f"{label}: {what}", flush=True)
            outcomes.append(run_revision(tree, label, scratch, scratch / "run", selected))
        differences = compare_outcomes(selected, *outcomes)
        differences += compare_files(
            scratch / "out-base", scratch / "out-head", (sources[0], sources[1]), selected
        )
        total = {
            label: sum(o.seconds for o in res.values())
            for label, res in zip(("base", "head"), outcomes, strict=True)
        }
        print(f"{len(selected)} commands; base {total['base']:.0f} s, head {total['head']:.0f} s")
        if differences:
            print(f"{len(differences)} outputs differ:")
            for d in differences:
                print(f"  {d}")
            return 1
        print("same bytes: every output and written file is identical")
        return 0
    finally:
        for tree in trees:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False
            )
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
