"""Property-based fuzzing of every input path: an answer, or one line and exit code 2.

Extreme and malformed values (0, -1, 2^30 +- 1, 2^63, 2^64, NaN, infinities, 1e-300, 1e300,
wrong types, nesting) go through trace validation, every importer, policy and search-space
loading, the deployment built from a policy, the exporters, both serving engines and the
cache engine (``trace mrc``). Each case must end in a result (for the engines: the same
result from both) or an :class:`InputError` of one line; through the CLI, exit code 0 or 2
with one line, never a signal, a traceback or a hang (each subprocess has a timeout).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.export import EXPORTERS, export
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import POLICY_FORMAT, policy_from_dict
from kvtier.policy.overrides import override_keys
from kvtier.search.space import SPACE_FORMAT, load_space
from kvtier.trace.format import Trace
from kvtier.trace.importers import format_names, import_trace
from tests.helpers import REPO, invoke

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SLOW = settings(SETTINGS, max_examples=6)

EDGE_INTS = [
    -(2**64),
    -(2**63),
    -1,
    0,
    1,
    2,
    15,
    16,
    17,
    4096,
    2**30 - 1,
    2**30,
    2**30 + 1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
]
EDGE_FLOATS = [
    math.nan,
    math.inf,
    -math.inf,
    0.0,
    -0.0,
    5e-324,
    1e-300,
    0.5,
    1.0,
    1e6,
    1e6 + 1,
    1e30,
    1e300,
]
ints = st.sampled_from(EDGE_INTS) | st.integers()
floats = st.sampled_from(EDGE_FLOATS) | st.floats()
scalars = ints | floats | st.booleans() | st.text(max_size=6) | st.sampled_from(["lru", "nope", ""])
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)

H100 = load_hardware("h100-node")
BELUGA = load_hardware("beluga-testbed")
LLAMA = load_model("Llama-3.1-8B")


def one_line(err: InputError) -> None:
    text = str(err)
    assert text and "\n" not in text, text


# --- trace validation --------------------------------------------------------------------------


int64s = st.sampled_from([v for v in EDGE_INTS if -(2**63) <= v < 2**63]) | st.integers(
    -(2**63), 2**63 - 1
)


@SETTINGS
@given(
    inputs=st.lists(int64s, min_size=1, max_size=4),
    outputs=st.lists(int64s, min_size=1, max_size=4),
    block_tokens=ints,
    unsigned=st.booleans(),
)
def test_trace_validation(
    inputs: list[int], outputs: list[int], block_tokens: int, unsigned: bool
) -> None:
    """Arrays as a trace's columns may hold them (int64, or uint64 reinterpreted)."""
    n = min(len(inputs), len(outputs))
    dtype = np.uint64 if unsigned else np.int64
    columns = [np.asarray(x[:n], dtype=np.int64).astype(dtype) for x in (inputs, outputs)]
    try:
        trace = Trace.from_arrays(
            arrival_s=np.arange(n, dtype=float),
            input_tokens=columns[0],
            output_tokens=columns[1],
            hash_offsets=np.zeros(n + 1, dtype=np.int64),
            hashes=np.zeros(0, dtype=np.uint64),
            block_tokens=block_tokens,
            source="fuzz",
        )
    except InputError as err:
        one_line(err)
    else:
        assert (trace.input_tokens >= 1).all() and (trace.input_tokens <= 2**30).all()


# --- every importer ----------------------------------------------------------------------------

cells = ints.map(str) | floats.map(repr) | st.sampled_from(["", " ", "nan", "1e400", '"', "\ufeff"])


@SETTINGS
@given(
    kind=st.sampled_from(format_names()),
    header=st.lists(
        st.sampled_from(
            [
                "TIMESTAMP",
                "ContextTokens",
                "GeneratedTokens",
                "Request tokens",
                "Response tokens",
                "Timestamp",
                "timestamp",
                "input_length",
                "output_length",
                "hash_ids",
            ]
        ),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    rows=st.lists(st.lists(cells, min_size=1, max_size=4), max_size=4),
    as_json=st.booleans(),
)
def test_every_importer(tmp_path_factory, kind: str, header, rows, as_json: bool) -> None:
    path = tmp_path_factory.mktemp("imp") / ("x.jsonl" if as_json else "x.csv")
    if as_json:
        lines = [json.dumps(dict(zip(header, r, strict=False))) for r in rows]
    else:
        lines = [",".join(header), *(",".join(r) for r in rows)]
    path.write_text("\n".join(lines) + "\n")
    try:
        trace = import_trace(kind, path)
    except InputError as err:
        one_line(err)
    else:
        assert trace.n_requests <= len(rows)


# --- policies: loading, deployment, export ---------------------------------------------------

policy_keys = st.sampled_from(sorted(override_keys()) + ["hardware", "model", "nope", "tiers"])


def nested(items: dict[str, object]) -> dict[str, object]:
    """Dotted keys as a policy file's nesting (``tiers.NAME.FIELD`` as a list of tables)."""
    data: dict[str, object] = {"format": POLICY_FORMAT}
    tiers: dict[str, dict[str, object]] = {}
    for key, value in items.items():
        parts = key.split(".")
        if parts[0] == "tiers" and len(parts) == 3:
            if parts[2] != "enabled":
                tiers.setdefault(parts[1], {"name": parts[1]})[parts[2]] = value
            else:
                tiers.setdefault(parts[1], {"name": parts[1]})
        elif len(parts) == 2:
            section = data.setdefault(parts[0], {})
            if isinstance(section, dict):
                section[parts[1]] = value
        else:
            data[key] = value
    if tiers:
        data["tiers"] = [tiers.pop("hbm", {"name": "hbm"}), *tiers.values()]
    return data


@SETTINGS
@given(items=st.dictionaries(policy_keys, values, max_size=5), beluga=st.booleans())
def test_policies_load_deploy_and_export(items: dict[str, object], beluga: bool) -> None:
    from kvtier.sim.config import build_config

    hardware = BELUGA if beluga else H100
    try:
        policy = policy_from_dict(nested(items), "fuzz.toml")
    except InputError as err:
        one_line(err)
        return
    try:
        build_config(hardware, LLAMA, policy)
    except InputError as err:
        one_line(err)
    for target in EXPORTERS.names:
        try:
            export(policy, target, hardware, LLAMA)
        except InputError as err:
            one_line(err)


@SETTINGS
@given(head=st.binary(max_size=40), depth=st.sampled_from([0, 1, 50, 5000]))
def test_policy_file_bytes(tmp_path_factory, head: bytes, depth: int) -> None:
    from kvtier.policy.model import load_policy

    path = tmp_path_factory.mktemp("pol") / "p.toml"
    path.write_bytes(head + b"\nx = " + b"[" * depth + b"]" * depth + b"\n")
    with pytest.raises(InputError) as err:
        load_policy(path)
    one_line(err.value)


# --- search spaces -----------------------------------------------------------------------------


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


space_keys = st.sampled_from(
    ["block_tokens", "serving.instances", "serving.max_num_batched_tokens", "kv_dtype"]
    + ["tiers.dram.capacity_gb", "tiers.cxl.enabled", "tiers.dram.eviction", "nope"]
)
param_specs = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(scalars, max_size=4),
        "low": ints | floats,
        "high": ints | floats,
        "step": ints | floats,
        "log": st.booleans() | ints,
        "when": st.dictionaries(space_keys, scalars, max_size=1),
    },
)


@SETTINGS
@given(
    params=st.dictionaries(space_keys, param_specs, min_size=1, max_size=3),
    pinned=st.dictionaries(space_keys, scalars, max_size=2),
)
def test_search_spaces_load_and_sample(tmp_path_factory, params, pinned) -> None:
    import optuna

    lines = [f'format = "{SPACE_FORMAT}"']
    for name, spec in params.items():
        lines.append(f'[params."{name}"]')
        for key, value in spec.items():
            if key == "when":
                inner = ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items())
                lines.append(f"when = {{ {inner} }}")
            else:
                lines.append(f"{key} = {toml_value(value)}")
    if pinned:
        lines.append("[pinned]")
        lines += [f'"{k}" = {toml_value(v)}' for k, v in pinned.items()]
    path = tmp_path_factory.mktemp("space") / "s.toml"
    path.write_text("\n".join(lines) + "\n")
    try:
        space = load_space(path)
    except InputError as err:
        one_line(err)
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        trial = study.ask()
        chosen = space.suggest(trial)  # a space that loads can always be sampled
        for p in space.params:
            if p.name in chosen and p.name not in space.pinned:
                p.check(chosen[p.name])
        study.tell(trial, 0.0)


# --- both serving engines ----------------------------------------------------------------------


@st.composite
def extreme_replays(draw: st.DrawFn):  # noqa: ANN202
    """Lengths-only traces with token counts up to the largest a trace may hold, on an HBM
    small enough that whatever is admitted finishes quickly in the reference engine."""
    from kvtier.trace.blocked import BlockedTrace

    n = draw(st.integers(1, 5))
    big = st.sampled_from([1, 2, 15, 16, 17, 255, 2**20, 2**30 - 1, 2**30])
    inputs = draw(st.lists(big, min_size=n, max_size=n))
    outputs = draw(st.lists(st.sampled_from([0, 1, 2, 64, 2**20, 2**30]), min_size=n, max_size=n))
    B = draw(st.sampled_from([1, 16, 1024, 2**20, 2**30]))
    gaps = draw(st.lists(st.sampled_from([0.0, 1e-9, 0.5, 1e6]), min_size=n, max_size=n))
    trace = BlockedTrace.from_lists(
        np.cumsum(gaps).tolist(), inputs, outputs, [[] for _ in range(n)], B
    )
    policy = {
        "format": POLICY_FORMAT,
        "block_tokens": B,
        "serving": {
            "instances": draw(st.integers(1, 8)),
            "max_num_seqs": draw(st.sampled_from([1, 2, 1024, 2**20])),
            "max_num_batched_tokens": draw(st.sampled_from([1, 16, 8192, 2**30])),
            "routing": draw(st.sampled_from(["round_robin", "least_loaded", "prefix_affinity"])),
        },
        "tiers": [{"name": "hbm", "capacity_gb": draw(st.sampled_from([1e-4, 0.01, 0.3]))}],
    }
    return trace, policy


@SETTINGS
@given(case=extreme_replays())
def test_both_engines_agree_on_extreme_counts(case) -> None:  # noqa: ANN001
    from kvtier.sim import build_config, simulate_raw

    trace, data = case
    try:
        cfg = build_config(H100, LLAMA, policy_from_dict(data, "fuzz"))
    except InputError as err:
        one_line(err)
        return
    results = []
    for engine in ("numba", "reference"):
        try:
            results.append(simulate_raw(trace, cfg, engine=engine))
        except InputError as err:
            one_line(err)
            results.append(type(err))
    fast, slow = results
    assert (fast is InputError) == (slow is InputError)
    if fast is not InputError:
        for name in ("first_token_s", "finish_s", "hit_blocks", "instance"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), name)


# --- the cache engine (trace mrc) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    path = tmp_path_factory.mktemp("mrc") / "t.parquet"
    write_trace(synthesize("chat", requests=30, rate=5.0, seed=1), path)
    return path


def policy_texts() -> st.SearchStrategy[str]:
    from kvtier.cache.registry import EVICTIONS

    names = list(EVICTIONS.names)
    keys = sorted({k for n in names for k in EVICTIONS.get(n).defaults} | {"nope"})
    pair = st.tuples(st.sampled_from(keys), floats.map(repr) | ints.map(str) | st.just("x"))

    def text(name: str, params: list[tuple[str, str]]) -> str:
        return f"{name}({','.join(f'{k}={v}' for k, v in params)})" if params else name

    return st.builds(text, st.sampled_from([*names, "nope"]), st.lists(pair, max_size=3))


@SETTINGS
@given(policy=policy_texts(), block=st.sampled_from(["1", "16", "0", "-1", "2147483648"]))
def test_mrc_policies(small_trace: Path, policy: str, block: str) -> None:
    result = invoke(
        "trace", "mrc", str(small_trace), "-B", block, "--policy", policy, "--capacities", "1,64"
    )
    assert result.code in (0, 2), (result.code, result.stderr)
    if result.code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
        assert "Traceback" not in result.stderr


# --- the CLI in subprocesses: importer, then both engines ---------------------------------------


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtier", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def assert_clean(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode in (0, 2), (proc.returncode, proc.stderr)  # < 0: a signal
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@SLOW
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["1", "64", "1073741824", "1073741825", "4611686018427387904", "-1"]),
            st.sampled_from(["0", "8", "1073741824", "9223372036854775807", "nan"]),
        ),
        min_size=1,
        max_size=3,
    ),
    block=st.sampled_from(["1", "16", "1073741824"]),
)
def test_cli_import_and_replay_never_crash(tmp_path_factory, rows, block: str) -> None:
    root = tmp_path_factory.mktemp("cli")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{46 + i}.0,{a},{b}" for i, (a, b) in enumerate(rows)]
    (root / "az.csv").write_text("\n".join(lines) + "\n")
    imported = run("trace", "import", "--from", "azure", "az.csv", "-o", "az.parquet", cwd=root)
    assert_clean(imported)
    if imported.returncode != 0:
        return
    outs = []
    for engine in ("numba", "reference"):
        proc = run(
            "replay", "--trace", "az.parquet", "-B", block, "--engine", engine, "--json", cwd=root
        )
        assert_clean(proc)
        outs.append(proc)
    assert outs[0].returncode == outs[1].returncode, [o.stderr for o in outs]
    if outs[0].returncode == 0:
        fast, slow = (json.loads(o.stdout) for o in outs)
        fast.pop("engine", None)
        slow.pop("engine", None)
        assert fast == slow


# --- corrupted files, extreme metadata, overlapping outputs, arrival offsets --------------------


def _tiny_trace(arrivals: np.ndarray | None = None) -> Trace:
    from tests.helpers import make_trace

    n = 12 if arrivals is None else len(arrivals)
    prompts = [[i % 4, 3, 1] * (12 + 5 * (i % 3)) for i in range(n)]
    return make_trace(
        prompts,
        16,
        arrivals=np.arange(1, n + 1) / 64 if arrivals is None else arrivals,
        outputs=[1 + (7 * i) % 20 for i in range(n)],
        tenants=[f"t{i % 3}" for i in range(n)],
    )


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, bytes]:
    from kvtier.trace.io import write_trace

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for suffix in (".parquet", ".arrow"):
        write_trace(_tiny_trace(), root / f"t{suffix}")
        out[suffix] = (root / f"t{suffix}").read_bytes()
    return out


@SETTINGS
@given(
    suffix=st.sampled_from([".parquet", ".arrow"]),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=4),
    cut=st.none() | st.floats(0.05, 1.0),
    stream=st.booleans(),
)
# a field name that no longer decodes as UTF-8 (found by this test)
@example(suffix=".arrow", flips=[(0.9375, 128)], cut=None, stream=True)
def test_corrupted_trace_files(tmp_path_factory, tiny_files, suffix, flips, cut, stream) -> None:
    """Bytes flipped anywhere (data, offsets, footer, schema) or the file cut short: every
    reader answers or says one line; never a decoding or index error from inside Arrow."""
    data = bytearray(tiny_files[suffix])
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    if cut is not None:
        data = data[: max(1, int(cut * len(data)))]
    path = tmp_path_factory.mktemp("bad") / f"t{suffix}"
    path.write_bytes(bytes(data))
    result = invoke("trace", "stats", str(path), "--stream" if stream else "--no-stream")
    assert result.code in (0, 2), result.stderr
    if result.code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


META_TEXTS = ["1", "16", "1_6", " 16", "0", "-1", "1e-320", "1e-300", "1e-12", "1e-3", "0.5",
              "1", "nan", "inf", "-0", "1e17", "1.7e12", "", "x", "0x10", "١٦"]  # fmt: skip


@SETTINGS
@given(
    key=st.sampled_from(
        ["kvtier.block_tokens", "kvtier.sample_fraction", "kvtier.arrival_offset_s"]
    ),
    value=st.sampled_from(META_TEXTS) | st.text(max_size=8),
)
def test_extreme_metadata(tmp_path_factory, key: str, value: str) -> None:
    """Any text in a numeric metadata key: a replay answers or refuses in one line naming it."""
    import pyarrow.parquet as pq

    from kvtier.trace.io import write_trace

    path = tmp_path_factory.mktemp("meta") / "t.parquet"
    write_trace(_tiny_trace(), path)
    table = pq.read_table(path)
    meta = {**table.schema.metadata, key.encode(): value.encode("utf-8", "surrogatepass")}
    pq.write_table(table.replace_schema_metadata(meta), path)
    for args in (("trace", "stats", str(path)), ("replay", "--trace", str(path), "--engine",
                                                 "reference", "--json")):  # fmt: skip
        result = invoke(*args)
        assert result.code in (0, 2), result.stderr
        if result.code == 2:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr


SPELLINGS = ["same", "dot", "dotdot", "abs", "symlink", "hardlink", "other", "in-dir"]


def _spell(root: Path, how: str) -> str:
    target = root / "d" / "a.parquet"
    if how == "same":
        return "d/a.parquet"
    if how == "dot":
        return "./d/./a.parquet"
    if how == "dotdot":
        return "d/../d/a.parquet"
    if how == "abs":
        return str(target)
    if how == "symlink":
        (root / "link.parquet").unlink(missing_ok=True)
        os.symlink(target, root / "link.parquet")
        return "link.parquet"
    if how == "hardlink":
        (root / "hard.parquet").unlink(missing_ok=True)
        os.link(target, root / "hard.parquet")
        return "hard.parquet"
    return "other.parquet" if how == "other" else "d/new.parquet"


@SETTINGS
@given(
    how=st.sampled_from(SPELLINGS),
    as_dir=st.booleans(),
    command=st.sampled_from(["replay", "sample", "slice", "mrc", "optimize", "guard"]),
)
def test_overlapping_outputs(tmp_path_factory, how: str, as_dir: bool, command: str) -> None:
    """An output spelled any way that reaches the input (or lies in its dataset directory) is
    refused in one line and the input is untouched; any other output passes the guard."""
    from kvtier.files import guard_outputs
    from kvtier.trace.io import write_trace

    root = tmp_path_factory.mktemp("overlap")
    (root / "d").mkdir()
    write_trace(_tiny_trace(), root / "d" / "a.parquet")
    before = (root / "d" / "a.parquet").read_bytes()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        out = _spell(root, how)
        source = "d" if as_dir else "d/a.parquet"
        # a hard link outside the dataset directory is another name of a part, not a part:
        # an atomic write replaces that name and leaves the part alone
        clash = (
            how != "other" and (as_dir or how != "in-dir") and not (as_dir and how == "hardlink")
        )
        if command == "guard" or not clash:
            if clash:
                with pytest.raises(InputError) as err:
                    guard_outputs({"--out": out}, {"--trace": source})
                one_line(err.value)
            else:
                guard_outputs({"--out": out}, {"--trace": source})
            return
        args = {
            "replay": ("replay", "--trace", source, "--requests-out", out),
            "sample": ("trace", "sample", source, "--fraction", "0.5", "-o", out),
            "slice": ("trace", "slice", source, "-o", out),
            "mrc": ("trace", "mrc", source, "-B", "16", "--plot", out),
            "optimize": ("optimize", "--trace", source, "--out", out, "--trials", "1"),
        }[command]
        result = invoke(*args)
        assert result.code == 2, (result.code, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert (root / "d" / "a.parquet").read_bytes() == before
        assert not (root / "runs").exists()
    finally:
        os.chdir(cwd)


@SLOW
@given(
    offset=st.sampled_from([1.0, 1e3, 1e6, 2.0**30, 1.7e9, 2.0**33 - 64, 2.0**33, 1.7e12, 1e17])
    | st.integers(1, 2**34).map(float),
    engine=st.sampled_from(["numba", "reference"]),
)
def test_arrival_offsets(tmp_path_factory, offset: float, engine: str) -> None:
    """The same trace with its clock started anywhere: the same results while a microsecond is
    resolved (steps of 1/64 s from an integer offset are exact), else one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtier.trace.io import write_trace

    root = tmp_path_factory.mktemp("offset")
    write_trace(_tiny_trace(), root / "base.parquet")
    table = pq.read_table(root / "base.parquet")
    moved = pa.array(table.column("arrival_s").to_numpy() + offset)
    pq.write_table(table.set_column(0, "arrival_s", moved), root / "moved.parquet")
    runs = [
        invoke("replay", "--trace", str(root / name), "--engine", engine, "--json")
        for name in ("base.parquet", "moved.parquet")
    ]
    assert runs[0].code == 0, runs[0].stderr
    if np.spacing(offset + 1) > 1e-6:
        assert runs[1].code == 2 and "arrival_s" in runs[1].stderr, runs[1].stderr
        assert len(runs[1].stderr.strip().splitlines()) == 1
    else:
        assert runs[1].code == 0, runs[1].stderr
        assert json.loads(runs[1].stdout) == json.loads(runs[0].stdout)
