"""Search spaces: which policy parameters the optimizer may change, and over what range.

A space is a TOML file (``policies/spaces/*.toml``, format ``kvtier-space/1``):

.. code-block:: toml

    format = "kvtier-space/1"
    description = "..."

    [params.block_tokens]
    choices = [16, 64, 256]

    [params."serving.max_num_batched_tokens"]
    low = 2048
    high = 16384
    log = true            # integer when low and high are integers

    [params."tiers.cxl.capacity_gb"]
    low = 64.0
    high = 8192.0
    log = true
    when = { "tiers.cxl.enabled" = true }   # only sampled when that holds

    [pinned]
    kv_dtype = "bf16"

Parameter names are dotted paths into the policy file (``optimizer/policy``), so a space can
name anything a policy can say, and a trial's parameters are a policy overlay. ``pinned``
fixes values; ``--pin name=value`` on the command line adds to it. Conditional parameters
(``when``) are sampled only when their condition holds, which Optuna's define-by-run API
expresses directly.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtier.builtin import policies_dir
from kvtier.errors import InputError
from kvtier.export import TARGETS as EXPORT_TARGETS
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.overrides import check_override, parse_overrides

SPACE_FORMAT = "kvtier-space/1"
# the keys a space file and each of its [params.NAME] tables may hold (named in the error for
# any other key, so a misspelt one shows what it should have been)
SPACE_KEYS = ("description", "format", "params", "pinned")
PARAM_KEYS = ("choices", "high", "log", "low", "step", "when")
SPACES_DIR = policies_dir() / "spaces"

Value = bool | int | float | str


@dataclass(frozen=True)
class Param:
    """One searchable parameter: a categorical choice or a numeric range."""

    name: str
    choices: tuple[Value, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    integer: bool = False
    when: tuple[tuple[str, Value | tuple[Value, ...]], ...] = ()  # a tuple: one of

    def __post_init__(self) -> None:
        if self.choices is not None:
            if not self.choices:
                raise ValueError(f"{self.name}: choices must not be empty")
            return
        if self.low is None or self.high is None:
            raise ValueError(f"{self.name}: needs choices, or low and high")
        if not self.low <= self.high:
            raise ValueError(
                f"{self.name}: low <= high must hold, but got low={self.low}, high={self.high}"
            )
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"{self.name}: low and high must be finite numbers")
        if self.log and self.low <= 0:
            raise ValueError(f"{self.name}: a log range needs low > 0, got low={self.low}")
        if self.step is not None:
            if not (math.isfinite(self.step) and self.step > 0):
                raise ValueError(f"{self.name}: step must be > 0, got {self.step}")
            if self.log:
                raise ValueError(f"{self.name}: a log range takes no step (Optuna's rule)")
            if self.integer and self.step != int(self.step):
                raise ValueError(
                    f"{self.name}: an integer range needs an integer step, got {self.step}"
                )
            if self.step > self.high - self.low and self.high > self.low:
                raise ValueError(
                    f"{self.name}: step {self.step} is larger than the range "
                    f"[{self.low}, {self.high}]"
                )

    def active(self, values: Mapping[str, Any]) -> bool:
        return all(condition_holds(values.get(k), v) for k, v in self.when)

    def suggest(self, trial: Any) -> Value:
        """Ask an Optuna trial for a value."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return trial.suggest_float(
            self.name, float(self.low), float(self.high), log=self.log, step=self.step
        )

    def distribution(self) -> Any:
        """The Optuna distribution :meth:`suggest` asks for: a study keeps one per parameter
        name, and a rerun's space is checked against it before any trial
        (:func:`kvtier.search.study.check_study_space`)."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.choices is not None:
            return CategoricalDistribution(list(self.choices))
        if self.integer:
            return IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def grid(self) -> list[Value]:
        """Every value of a discrete parameter (for exhaustive search of small spaces)."""
        if self.choices is not None:
            return list(self.choices)
        if self.integer:
            if self.log:
                raise ValueError(f"{self.name}: a log-scaled range has no grid; use choices")
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step:
            n = int(math.floor((self.high - self.low) / self.step + 1e-9))
            return [self.low + i * self.step for i in range(n + 1)]
        raise ValueError(f"{self.name}: a continuous range has no grid")

    def check(self, value: Value) -> None:
        """Refuse a pinned value outside the parameter's domain."""
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{self.name}: {value!r} is not one of {list(self.choices)}")
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{self.name}: expected a number, got {value!r}")
        if not self.low <= value <= self.high:
            raise ValueError(f"{self.name}: {value} is outside [{self.low}, {self.high}]")


@dataclass(frozen=True)
class SearchSpace:
    """Parameters to search and values pinned; built from TOML, extended by ``--pin``."""

    params: tuple[Param, ...]
    pinned: dict[str, Value] = field(default_factory=dict)
    description: str = ""
    source: str = ""

    def free(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.name not in self.pinned)

    def suggest(self, trial: Any) -> dict[str, Value]:
        """All values of one trial: pinned ones, then the free ones whose condition holds."""
        values: dict[str, Value] = dict(self.pinned)
        for p in self.free():
            if p.active(values):
                values[p.name] = p.suggest(trial)
        return values

    def with_pins(self, pins: Mapping[str, Value]) -> SearchSpace:
        """The space with ``pins`` fixed; an unknown key or a value outside the policy's
        domain or the parameter's range is an :class:`InputError` naming ``--pin KEY``."""
        known = {p.name: p for p in self.params}
        checked: dict[str, Value] = {}
        for name, value in pins.items():
            checked[name] = check_pin(name, value)
            if name in known:
                try:
                    known[name].check(checked[name])
                except ValueError as err:
                    raise InputError(str(err), option=f"--pin {name}") from None
        pinned = {**self.pinned, **checked}
        return SearchSpace(fixed_split(self.params, pinned), pinned, self.description, self.source)

    def size(self) -> int | None:
        """Number of points of a fully discrete space without conditions, else None."""
        total = 1
        for p in self.free():
            if p.when:
                return None
            try:
                total *= len(p.grid())
            except ValueError:
                return None
        return total

    def grid(self) -> list[dict[str, Value]]:
        """Every point of a discrete space (conditions respected)."""
        points: list[dict[str, Value]] = [dict(self.pinned)]
        for p in self.free():
            nxt: list[dict[str, Value]] = []
            for point in points:
                if p.active(point):
                    nxt.extend({**point, p.name: v} for v in p.grid())
                else:
                    nxt.append(point)
            points = nxt
        return points


SPLIT_COUNT, SPLIT_SHARE = "serving.prefill_instances", "serving.prefill_share"


def fixed_split(params: tuple[Param, ...], pinned: Mapping[str, Value]) -> tuple[Param, ...]:
    """``params`` under a pinned prefill instance count (docs/policy.md, "The split").

    A count fixes the prefill/decode split, so a searched ``serving.prefill_share`` would be
    ignored by every trial: it is left out, a condition on it is read as "the split is on"
    (a parameter sampled only for a nonzero share is then always sampled, one sampled only
    without a split never is). A count and a nonzero share both pinned is the user's
    conflict: an :class:`InputError` naming both keys.
    """
    count = pinned.get(SPLIT_COUNT)
    if not count:
        return params  # 0 leaves the split to the share
    share = pinned.get(SPLIT_SHARE)
    if share:
        raise InputError(
            f"{SPLIT_SHARE} = {share:g} and {SPLIT_COUNT} = {count} both set the "
            f"prefill/decode split; pin one ({SPLIT_COUNT} = 0 leaves the split to the share)",
            option=f"--pin {SPLIT_SHARE}",
        )
    kept = []
    for p in params:
        if p.name == SPLIT_SHARE:
            continue
        when = []
        sampled = True
        for key, cond in p.when:
            if key != SPLIT_SHARE:
                when.append((key, cond))
            elif not any(v for v in (cond if isinstance(cond, tuple) else (cond,))):
                sampled = False  # only without a split: never, under a pinned count
        if sampled:
            kept.append(replace(p, when=tuple(when)))
    return tuple(kept)


def condition_holds(value: Any, condition: Value | tuple[Value, ...]) -> bool:
    """A ``when`` entry holds: the value equals it, or is one of its list."""
    if isinstance(condition, tuple):
        return value in condition
    return value == condition


def _check_domain(param: Param, path: str) -> Param:
    """Every value a parameter can take must be one the policy accepts for that key."""
    where = f"params.{param.name}"
    values = param.choices if param.choices is not None else (param.low, param.high)
    try:
        for value in values:
            check_pin(param.name, value)
        for key, value in param.when:
            for one in value if isinstance(value, tuple) else (value,):
                check_pin(key, one)
    except InputError as err:
        raise InputError(err.message, path=path, column=where) from None
    return param


def _parse_param(name: str, spec: Any, path: str) -> Param:
    return _check_domain(_parse_param_spec(name, spec, path), path)


def _parse_param_spec(name: str, spec: Any, path: str) -> Param:
    where = f"params.{name}"
    if not isinstance(spec, dict):
        raise InputError("must be a table", path=path, column=where)
    unknown = set(spec) - set(PARAM_KEYS)
    if unknown:
        raise InputError(
            f"unknown key(s) {sorted(unknown)} (valid: {', '.join(PARAM_KEYS)})",
            path=path,
            column=where,
        )
    when = spec.get("when", {})
    if not isinstance(when, dict):
        raise InputError("'when' must be a table of name = value", path=path, column=where)
    # a list is "one of": the parameter is sampled when the named one takes any of them
    when = {k: tuple(v) if isinstance(v, list) else v for k, v in when.items()}
    if any(isinstance(v, tuple) and not v for v in when.values()):
        raise InputError("'when' lists no value", path=path, column=where)
    try:
        if "choices" in spec:
            choices = spec["choices"]
            if not isinstance(choices, list):
                raise ValueError("choices must be a list")
            return Param(name, choices=tuple(choices), when=tuple(when.items()))
        low, high = spec.get("low"), spec.get("high")
        for key, v in (("low", low), ("high", high), ("step", spec.get("step"))):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{key} must be a number, got {v!r}")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ValueError(f"log must be true or false, got {log!r}")
        integer = isinstance(low, int) and isinstance(high, int)
        return Param(
            name,
            low=low,
            high=high,
            log=log,
            step=spec.get("step"),
            integer=integer,
            when=tuple(when.items()),
        )
    except ValueError as err:
        raise InputError(str(err), path=path, column=where) from None


def space_names() -> list[str]:
    """The built-in search spaces, by name."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.toml"))


def space_path(name_or_path: str | Path) -> Path:
    """The file of a space: a path that ends in ``.toml`` or names a file, else a built-in
    name. A name is never joined to the spaces directory as a path: ``../presets/x`` is an
    unknown name, not a file outside it."""
    text = str(name_or_path)
    known = ", ".join(space_names())
    if not text.strip():
        raise InputError(f"must name a search space (built-in: {known})", option="--space")
    path = Path(text)
    if path.suffix == ".toml" or path.is_file():
        return path
    if text in space_names():
        return SPACES_DIR / f"{text}.toml"
    raise InputError(
        f"no such search space {text!r} (built-in: {known}; or a path to a .toml file)",
        option="--space",
    )


def _check_conditions(params: tuple[Param, ...], pinned: Mapping[str, Any], path: str) -> None:
    """Refuse a ``when`` that can never hold, so its parameter would never be sampled.

    Parameters are sampled in file order, so a condition must name a parameter listed
    before it (or a pinned key), with a value that parameter can take.
    """
    seen: dict[str, Param] = {}
    for p in params:
        for key, value in p.when:
            where = f"params.{p.name}"
            if key in pinned:
                continue
            if key not in seen:
                later = "listed after it" if any(q.name == key for q in params) else "not in"
                raise InputError(
                    f"'when' names {key!r}, which is {later} this space's parameters and not "
                    f"pinned: {p.name} would never be sampled",
                    path=path,
                    column=where,
                )
            try:
                for one in value if isinstance(value, tuple) else (value,):
                    seen[key].check(one)
            except ValueError:
                raise InputError(
                    f"'when' needs {key} = {value!r}, a value that parameter never takes: "
                    f"{p.name} would never be sampled",
                    path=path,
                    column=where,
                ) from None
        seen[p.name] = p


def load_space(name_or_path: str | Path) -> SearchSpace:
    """A space by file path, or by name from ``policies/spaces`` (``default``, ...)."""
    path = space_path(name_or_path)
    spath = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        known = sorted(p.stem for p in SPACES_DIR.glob("*.toml"))
        raise InputError(
            f"no such search space (built-in: {', '.join(known)})", path=spath
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"invalid TOML: {err}", path=spath) from None
    except RecursionError:
        raise InputError("invalid TOML: nested too deeply", path=spath) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err}", path=spath) from None
    fmt = data.get("format")
    if fmt != SPACE_FORMAT:
        raise InputError(f"must be '{SPACE_FORMAT}', got {fmt!r}", path=spath, column="format")
    unknown = set(data) - set(SPACE_KEYS)
    if unknown:
        raise InputError(
            f"unknown key(s) {sorted(unknown)} (valid: {', '.join(SPACE_KEYS)})", path=spath
        )
    params_spec = data.get("params", {})
    if not isinstance(params_spec, dict) or not params_spec:
        raise InputError("needs at least one [params.NAME] table", path=spath, column="params")
    params = tuple(_parse_param(k, v, spath) for k, v in params_spec.items())
    pinned = data.get("pinned", {})
    if not isinstance(pinned, dict):
        raise InputError("must be a table", path=spath, column="pinned")
    both = [p.name for p in params if p.name in pinned]
    if both:
        raise InputError(
            f"{both[0]!r} is both searched ([params.{both[0]}]) and pinned: a space file "
            "gives each parameter once (to fix a searched one for a run, use --pin)",
            path=spath,
            column=f"pinned.{both[0]}",
        )
    _check_conditions(params, pinned, spath)
    space = SearchSpace(params, {}, str(data.get("description", "")), spath)
    try:
        return space.with_pins(pinned)
    except InputError as err:
        raise InputError(err.message, path=spath, column="pinned") from None


def check_pin(name: str, value: Any, option: str = "--pin") -> Value:
    """A pinned or searched value checked against the policy's own field (``--pin`` keys are
    ``--set`` keys, less the SLO, which the search takes from ``--slo``)."""
    if name.startswith("slo."):
        raise InputError(
            f"key {name!r}: the search's SLO is set with --slo, not pinned", option=option
        )
    return check_override(name, value, option)


def parse_pins(texts: Iterable[str]) -> dict[str, Value]:
    """``--pin KEY=VALUE`` items -> ``{key: value}``, keys and values validated; a bad one is
    one :class:`InputError` line naming the key and listing the valid ones."""
    pins = parse_overrides(tuple(texts), "--pin")
    for name, value in pins.items():
        check_pin(name, value)
    return pins


def parse_pin(text: str) -> tuple[str, Value]:
    """One ``--pin name=value`` (see :func:`parse_pins`)."""
    ((name, value),) = parse_pins((text,)).items()
    return name, value


TARGETS = EXPORT_TARGETS  # the exporter registry's names (kvtier.export)


def restrict_to_target(space: SearchSpace, target: str, lower_tiers: Iterable[str]) -> SearchSpace:
    """``space`` cut down to what ``target`` can express, as its exporter declares it
    (:mod:`kvtier.export.capabilities`): its tiers, the values of each setting it can
    configure, the block sizes of the release it targets and the conditions between tiers.
    ``lower_tiers`` are the tiers the hardware has. A pin outside the target's capabilities is
    an :class:`InputError` naming it."""
    from kvtier.export.capabilities import capabilities

    if target not in TARGETS:
        raise InputError(
            f"unknown target {target!r} (choices: {', '.join(TARGETS)})", option="--target"
        )
    caps = capabilities(target)
    present = set(lower_tiers)
    missing = [t for t in caps.need if t not in present]
    if missing:
        raise InputError(
            f"{target} needs a {', '.join(missing)} tier, which the hardware profile lacks",
            option="--target",
        )
    allowed: dict[str, tuple[Value, ...]] = caps.allowed()
    for tier in LOWER_TIERS:
        if tier not in caps.tiers or tier not in present:
            allowed[f"tiers.{tier}.enabled"] = (False,)
        elif tier in caps.need:
            allowed[f"tiers.{tier}.enabled"] = (True,)
        allowed[f"tiers.{tier}.eviction"] = caps.evictions
    block = caps.block
    release = f"{target} ({caps.package.split('@')[0]} {caps.version})"
    params = []
    for p in space.params:
        keep = allowed.get(p.name)
        if p.name == "block_tokens" and p.choices is not None:
            keep = tuple(c for c in p.choices if block.accepts(int(c)))
            if not keep:
                raise InputError(
                    f"space {space.source or '<space>'}: block_tokens takes no block size "
                    f"{release} accepts ({block.describe()})",
                    option="--target",
                )
        if keep is not None and p.choices is not None:
            kept = tuple(c for c in p.choices if c in keep)
            if not kept:
                raise InputError(
                    f"space {space.source or '<space>'}: {p.name} takes none of "
                    f"{target}'s values ({', '.join(map(str, keep))})",
                    option="--target",
                )
            p = replace(p, choices=kept)
        extra = caps.requires.get(p.name, ())
        if extra:
            p = replace(p, when=(*p.when, *extra))
        params.append(p)
    if "block_tokens" in space.pinned and not block.accepts(int(space.pinned["block_tokens"])):
        raise InputError(
            f"block_tokens = {space.pinned['block_tokens']!r} cannot be expressed by {release}, "
            f"which accepts {block.describe()}",
            option="--pin block_tokens",
        )
    names = {p.name for p in params}
    pins: dict[str, Value] = {}
    for key, values in allowed.items():
        if key in space.pinned:
            if space.pinned[key] not in values:
                raise InputError(
                    f"{key} = {space.pinned[key]!r} cannot be expressed by {target} "
                    f"(it takes {', '.join(map(str, values))})",
                    option=f"--pin {key}",
                )
            continue
        if key not in names or len(values) == 1:
            if key.endswith(".eviction") and key not in names:
                continue  # a tier's eviction defaults to lru
            pins[key] = values[0]
    restricted = SearchSpace(tuple(params), dict(space.pinned), space.description, space.source)
    restricted = restricted.with_pins(pins)
    # a requirement may name a parameter the space pins rather than searches: keep it valid
    _check_conditions(restricted.params, restricted.pinned, space.source or "<space>")
    return restricted
