"""Regenerate ``optimizer/export/releases/*.json``: the names each export target's release reads.

For every package an exporter writes for (``kvtier.export.releases.PACKAGES``), download its
released wheel (``pip download --no-deps``), read its sources and binaries, and write one JSON
list per package and version: the command-line flags it declares, the environment variables it
reads and the configuration keys it accepts. ``tests/test_export_releases.py`` checks every
name an export of every preset writes against the list of the version that export targets.

What is read, per package (each rule a pattern of the released source, not a guess):

* flags (also grouped by the module that declares them, its first two path parts, so one
  command's flags are told from another's): every ``"--name"`` passed to an ``add_argument``
  call, or as ``flag_name=`` / ``cli_name=`` / ``aliases=`` (Dynamo's and SGLang's argument
  helpers); SGLang's dataclass fields declared ``name: A[...]`` in ``srt/arg_groups/fields``
  (``--name-with-dashes``, as ``add_cli_args_from_dataclass`` spells them); the gflags of a
  C++ binary (Mooncake's master: the run of flag names its ``.rodata`` holds beside
  ``rpc_port``, and the names the linker stored only as the end of a longer one, where the
  master's configuration dump names them).
* environment variables: ``os.getenv("X")``, ``os.environ.get("X")``, ``os.environ["X"]``,
  ``"X" in os.environ``, ``env_var="X"`` (Dynamo), the keys of vLLM's ``envs.py``
  ``environment_variables`` table, SGLang's ``class Envs`` attributes (``srt/environ.py``), and
  the names with the package's prefix in its compiled libraries (KVBM's and Mooncake's are
  read in Rust and C++).
* config keys: LMCache's ``_CONFIG_DEFINITIONS`` (``lmcache/v1/config.py``) and the Mooncake
  keys its ``extra_config`` forwards (``mooncakestore_connector.py``); the keys
  ``MooncakeConfig`` reads (``mooncake_config.py``); vLLM's ``KVTransferConfig`` and
  ``KVEventsConfig`` fields and its
  registered KV connectors (``kv_connector/factory.py``); the connectors KVBM defines.

Usage: ``python scripts/pin_releases.py [--wheels DIR] [PACKAGE==VERSION ...]`` (no packages:
every pinned one). ``--wheels`` reuses wheels already downloaded there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "optimizer" / "export" / "releases"
sys.path.insert(0, str(ROOT / "optimizer"))

# the prefixes of environment variables a package reads in compiled code
BINARY_ENV_PREFIXES = {
    "kvbm": ("DYN_KVBM_", "DYN_"),
    "mooncake-transfer-engine": ("MOONCAKE_", "MC_"),
    "nixl-cu12": ("NIXL_",),
}
ENV_NAME = re.compile(rb"[A-Z][A-Z0-9_]{3,}")


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    if isinstance(node, ast.Attribute) and node.attr == "environ":
        return True
    return isinstance(node, ast.Name) and node.id == "environ"


def _is_negatable(node: ast.AST) -> bool:
    """``argparse.BooleanOptionalAction`` (which also declares ``--no-<name>``)."""
    return getattr(node, "attr", getattr(node, "id", "")) == "BooleanOptionalAction"


class _Reader(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.flags: set[str] = set()
        self.env: set[str] = set()
        # vLLM: ``add_argument("--flag", **kwargs_var["field"])`` (the flag, the variable and
        # the field), and ``kwargs_var = get_kwargs(ConfigClass)``
        self.spreads: list[tuple[str, str, str]] = []
        self.kwargs_of: dict[str, str] = {}

    def _flag(self, text: str | None) -> bool:
        if text and text.startswith("--") and re.fullmatch(r"--[A-Za-z0-9][\w.-]*", text):
            self.flags.add(text)
            return True
        return False

    def visit_Assign(self, node: ast.Assign) -> None:
        value = node.value
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(value, ast.Call)
            and getattr(value.func, "id", "") == "get_kwargs"
            and value.args
            and isinstance(value.args[0], ast.Name)
        ):
            self.kwargs_of[node.targets[0].id] = value.args[0].id
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "add_argument":
            declared = [t for t in map(_str, node.args) if self._flag(t)]
            for kw in node.keywords:
                if kw.arg == "action" and _is_negatable(kw.value):
                    for flag in declared:
                        self._flag("--no-" + flag[2:])
                if (
                    kw.arg is None
                    and isinstance(kw.value, ast.Subscript)
                    and isinstance(kw.value.value, ast.Name)
                    and _str(kw.value.slice)
                ):
                    for flag in declared:
                        self.spreads.append((flag, kw.value.value.id, _str(kw.value.slice)))
        for kw in node.keywords:
            if kw.arg in ("flag_name", "cli_name"):
                self._flag(_str(kw.value))
            elif kw.arg == "aliases" and isinstance(kw.value, (ast.List, ast.Tuple)):
                for elt in kw.value.elts:
                    self._flag(_str(elt))
            elif kw.arg == "env_var":
                text = _str(kw.value)
                if text:
                    self.env.add(text)
        if node.args and (
            name == "getenv"
            or (name in ("get", "pop", "setdefault") and _is_environ(getattr(func, "value", None)))
        ):
            text = _str(node.args[0])
            if text:
                self.env.add(text)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_environ(node.value):
            text = _str(node.slice)
            if text:
                self.env.add(text)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
            _is_environ(c) for c in node.comparators
        ):
            text = _str(node.left)
            if text:
                self.env.add(text)
        self.generic_visit(node)


def _field_types(tree: ast.Module) -> dict[tuple[str, str], set[str]]:
    """(class, field) -> the names in the field's annotation, for every annotated field."""
    out: dict[tuple[str, str], set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names = {
                        n.id if isinstance(n, ast.Name) else str(n.value)
                        for n in ast.walk(item.annotation)
                        if isinstance(n, (ast.Name, ast.Constant))
                    }
                    out[(node.name, item.target.id)] = names
    return out


def _negated_bools(
    spreads: list[tuple[str, str, str]],
    kwargs_of: dict[str, str],
    types: dict[tuple[str, str], set[str]],
) -> set[str]:
    """vLLM's ``--no-<flag>`` for the flags its ``get_kwargs`` makes
    ``BooleanOptionalAction`` (``engine/arg_utils.py``: a field whose type holds ``bool``,
    unless it is exactly ``bool | str | None``, an optional-valued flag)."""
    out: set[str] = set()
    for flag, var, field in spreads:
        names = types.get((kwargs_of.get(var, ""), field), set())
        if "bool" in names and not {"bool", "str", "None"} <= names:
            out.add("--no-" + flag[2:])
    return out


def _vllm_envs(tree: ast.Module) -> set[str]:
    """The keys of ``environment_variables`` in vLLM's ``envs.py``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(node.value, ast.Dict)
        ):
            out |= {k for k in map(_str, node.value.keys) if k}
    return out


def _sglang_envs(tree: ast.Module) -> set[str]:
    """The attributes of SGLang's ``class Envs`` (``srt/environ.py``) declared ``EnvX(...)``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.value, ast.Call)
                    and getattr(item.value.func, "id", "").startswith("Env")
                ):
                    out |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return out


def _sglang_fields(tree: ast.Module) -> set[str]:
    """``--flags`` of SGLang's dataclass fields ``name: A[T, "help" | Arg(...)]``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and isinstance(item.annotation, ast.Subscript)
                and getattr(item.annotation.value, "id", "") == "A"
            ):
                continue
            cli_name = None
            no_cli = False
            for sub in ast.walk(item.annotation):
                if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "Arg":
                    for kw in sub.keywords:
                        if kw.arg == "cli_name":
                            cli_name = _str(kw.value)
                        if kw.arg == "no_cli" and getattr(kw.value, "value", False) is True:
                            no_cli = True
            if not no_cli:
                out.add(cli_name or "--" + item.target.id.replace("_", "-"))
    return out


def _dict_keys(tree: ast.Module, name: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = node.value
            if isinstance(value, ast.Dict):
                out |= {k for k in map(_str, value.keys) if k}
            elif isinstance(value, (ast.Set, ast.List, ast.Tuple)):
                out |= {k for k in map(_str, value.elts) if k}
    return out


def _get_keys(tree: ast.Module, receiver: str) -> set[str]:
    """String keys of ``receiver.get("k")`` and ``receiver["k"]``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and getattr(node.func.value, "id", None) == receiver
            and node.args
        ):
            out |= {k for k in [_str(node.args[0])] if k}
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == receiver:
            out |= {k for k in [_str(node.slice)] if k}
    return out


def _class_fields(tree: ast.Module, cls: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out |= {
                i.target.id
                for i in node.body
                if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
            }
    return out


def _registered_connectors(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "register_connector"
            and node.args
        ):
            out |= {k for k in [_str(node.args[0])] if k}
    return out


def _binary_env(data: bytes, prefixes: tuple[str, ...]) -> set[str]:
    """Names with one of ``prefixes`` in a compiled library; names stored end to end (Rust
    keeps strings without terminators) are split where the next one starts."""
    out: set[str] = set()
    for match in ENV_NAME.finditer(data):
        text = match.group().decode()
        first = prefixes[0]
        for part in re.split(f"(?={re.escape(first)})", text):
            if any(part.startswith(p) for p in prefixes) and len(part) > len(first):
                out.add(part)
    return out


def _gflags(data: bytes, anchor: str) -> set[str]:
    """The flag names of a gflags binary: the longest run of identifier strings (in
    ``.rodata`` order) that holds ``anchor``."""
    strings = [s.decode() for s in re.findall(rb"[\x20-\x7e]{3,}", data)]
    for i, text in enumerate(strings):
        if text != anchor:
            continue
        lo = i
        while lo > 0 and re.fullmatch(r"[a-z][a-z0-9_]+", strings[lo - 1]):
            lo -= 1
        hi = i
        while hi + 1 < len(strings) and re.fullmatch(r"[a-z][a-z0-9_]+", strings[hi + 1]):
            hi += 1
        if hi - lo > 10:
            names = set(strings[lo : hi + 1])
            return {f"--{s}" for s in names | _tail_merged(data, names)}
    return set()


def _tail_merged(data: bytes, names: set[str]) -> set[str]:
    """Flag names stored only as the end of a longer one. Mooncake's master declares each
    memory-pool eviction flag beside an NVMe-oF twin (``eviction_ratio`` and
    ``nof_eviction_ratio``, ``mooncake-store/src/master.cpp``), and the linker keeps one string
    for both, so the shorter name is no string of its own. The name after a twin's ``nof_``
    counts when the master's configuration dump (each field logged as ``", name="``) names it
    too."""
    dumped = {m.decode() for m in re.findall(rb", ([a-z][a-z0-9_]+)=", data)}
    tails = {n.removeprefix("nof_") for n in names if n.startswith("nof_")}
    return (tails & dumped) - names


def read_wheel(package: str, wheel: Path) -> dict[str, object]:
    """The flags, environment variables and config keys of one released wheel."""
    flags: set[str] = set()
    env: set[str] = set()
    config: dict[str, set[str]] = {}
    by_module: dict[str, set[str]] = {}  # "dynamo/vllm" -> the flags declared under it
    spreads: dict[str, list[tuple[str, str, str]]] = {}  # module -> vLLM's **kwargs flags
    kwargs_of: dict[str, str] = {}
    types: dict[tuple[str, str], set[str]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if "/tests/" in name or name.startswith("tests/"):
                continue
            if name.endswith(".py"):
                try:
                    tree = ast.parse(zf.read(name))
                except SyntaxError:
                    continue
                reader = _Reader(name)
                reader.visit(tree)
                flags |= reader.flags
                module = "/".join(name.split("/")[:2])
                by_module.setdefault(module, set()).update(reader.flags)
                spreads.setdefault(module, []).extend(reader.spreads)
                kwargs_of.update(reader.kwargs_of)
                if name.startswith("vllm/config/"):
                    types.update(_field_types(tree))
                env |= reader.env
                if name == "vllm/envs.py":
                    env |= _vllm_envs(tree)
                if name == "sglang/srt/environ.py":
                    env |= _sglang_envs(tree)
                if name.startswith("sglang/srt/arg_groups/fields/"):
                    flags |= _sglang_fields(tree)
                    by_module.setdefault(module, set()).update(_sglang_fields(tree))
                if name == "lmcache/v1/config.py":
                    config.setdefault("lmcache.yaml", set()).update(
                        _dict_keys(tree, "_CONFIG_DEFINITIONS")
                    )
                if name.endswith("connector/mooncakestore_connector.py"):
                    keys = _dict_keys(tree, "_LEGACY_PASSTHROUGH_KEYS") | _dict_keys(
                        tree, "_SETUP_DEFAULTS"
                    )
                    extra = keys | {f"mooncake_{k}" for k in keys}
                    extra |= _dict_keys(tree, "_LMCACHE_ONLY_KEYS")
                    config.setdefault("lmcache.yaml:extra_config", set()).update(extra)
                if name == "mooncake/mooncake_config.py":
                    config.setdefault("mooncake.json", set()).update(_get_keys(tree, "config"))
                if name == "vllm/config/kv_transfer.py":
                    config.setdefault("kv_transfer_config", set()).update(
                        _class_fields(tree, "KVTransferConfig")
                    )
                if name == "vllm/config/kv_events.py":
                    config.setdefault("kv_events_config", set()).update(
                        _class_fields(tree, "KVEventsConfig")
                    )
                if name == "vllm/distributed/kv_transfer/kv_connector/factory.py":
                    config.setdefault("kv_connector", set()).update(_registered_connectors(tree))
                if name.startswith("kvbm/vllm_integration/connector/"):
                    config.setdefault("kv_connector", set()).update(
                        n.name
                        for n in ast.walk(tree)
                        if isinstance(n, ast.ClassDef) and n.name.endswith("Connector")
                    )
            elif package in BINARY_ENV_PREFIXES and (
                name.endswith(".so") or ".so." in name or name.endswith("/mooncake_master")
            ):
                data = zf.read(name)
                env |= _binary_env(data, BINARY_ENV_PREFIXES[package])
                if name.endswith("/mooncake_master"):
                    flags |= _gflags(data, "rpc_port")
                    by_module["mooncake/mooncake_master"] = _gflags(data, "rpc_port")
    for module, found in spreads.items():
        negated = _negated_bools(found, kwargs_of, types)
        flags |= negated
        by_module.setdefault(module, set()).update(negated)
    return {
        "flags": sorted(flags),
        "env": sorted(env),
        "config": {k: sorted(v) for k, v in sorted(config.items())},
        "flags_by_module": {k: sorted(v) for k, v in sorted(by_module.items()) if v},
    }


def _download(package: str, version: str, wheels: Path) -> Path:
    norm = package.replace("-", "_")
    found = sorted(wheels.glob(f"{norm}-{version}-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(wheels),
                f"{package}=={version}",
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"{norm}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no wheel of {package}=={version} in {wheels}")
    return found[0]


def pin(package: str, version: str, wheels: Path) -> Path:
    wheel = _download(package, version, wheels)
    doc = {
        "package": package,
        "version": version,
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        **read_wheel(package, wheel),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{package}-{version}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    from kvtier.export.releases import pins as pinned

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=None, help="directory of wheels")
    parser.add_argument("packages", nargs="*", help="PACKAGE==VERSION (default: every pin)")
    args = parser.parse_args(argv)
    pins = [tuple(p.split("==", 1)) for p in args.packages] or pinned()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = args.wheels or Path(tmp)
        for package, version in pins:
            path = pin(package, version, wheels)
            doc = json.loads(path.read_text())
            print(
                f"{path.relative_to(ROOT)}: {len(doc['flags'])} flags, {len(doc['env'])} "
                f"environment variables, {sum(map(len, doc['config'].values()))} config keys"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
