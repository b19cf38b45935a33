"""What ``optimize`` is asked to do, declared once: one dataclass whose fields carry the
command-line option each is set by.

Each field that the command sets is declared with :func:`option`, whose metadata holds the
option's spelling, type, default shown, help and the conversion from what the option gives
to the field's value (as :mod:`kvtier.policy.fields` declares the policy's ``--set`` keys).
``kvtier.cli.optimize`` generates the ``optimize`` and ``batch`` options from these
declarations (:func:`cli_options`), and :func:`request_from_options` turns the options'
values back into a request, so an option cannot drift from the field it sets. The metadata is
plain data (no click objects): this floor does not import the CLI's library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from kvtier.search.space import parse_pins

TARGET_CHOICES = ("vllm", "lmcache", "sglang", "dynamo", "mooncake")


@dataclass(frozen=True)
class CliOption:
    """One command-line option of a request field.

    ``decls``: the option's spellings (``--trials``); ``kind``: ``str``, ``int``, ``float``,
    ``path`` (a file name), ``file`` (a file, not a directory), ``choice`` (one of
    ``choices``), ``flag`` (present or not; ``flag_value`` is the field's value when given)
    or ``multiple`` (repeatable, collected in a tuple); ``minimum`` bounds numbers from below
    (``min_open``: strictly); ``convert`` maps the option's value to the field's.
    """

    decls: tuple[str, ...]
    help: str
    kind: str = "str"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    min_open: bool = False
    show_default: bool = False
    required: bool = False
    metavar: str | None = None
    flag_value: Any = True
    convert: Callable[[Any], Any] | None = None

    @property
    def flag(self) -> str:
        """The option's main spelling, as errors name it."""
        return self.decls[0]


def option(default: Any, *decls: str, help: str, factory: bool = False, **how: Any) -> Any:
    """A request field set by the option spelt ``decls``; ``how`` as :class:`CliOption` takes.

    ``factory``: ``default`` is a zero-argument callable giving a fresh default each time;
    ``MISSING``: the field has no default (the option is required)."""
    meta = {"cli": CliOption(decls=decls, help=help, **how)}
    if default is MISSING:
        return field(metadata=meta)
    if factory:
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def _pins(texts: Any) -> dict[str, Any]:
    return parse_pins(texts or ())


@dataclass(frozen=True)
class OptimizeRequest:
    """Everything one ``optimize`` run is asked: the trace, what to search, how long, where to
    keep the study and the policy file, and what to compare the winner with.

    The fields in the order the command lists its options; :func:`kvtier.search.run.optimize`
    takes the same names as keywords. ``runs_dir``, ``on_trial`` and ``on_bound`` are set by
    callers, not by options (the hooks feed a progress display).
    """

    trace_path: str = option(
        MISSING,
        "--trace",
        help="Request trace (request-trace/1: .parquet or .arrow, or a directory of "
        "Parquet parts).",
        kind="path",
        required=True,
    )
    hardware: str | None = option(
        None, "--hardware", help="Hardware profile name or TOML path [default: h100-node]."
    )
    model: str | None = option(
        None, "--model", help="Model profile name or TOML path [default: Llama-3.1-8B]."
    )
    space: str = option(
        "default",
        "--space",
        help="Search space: a name in policies/spaces or a TOML path.",
        show_default=True,
    )
    pins: dict[str, Any] = option(
        dict,
        "--pin",
        factory=True,
        help="Fix a parameter, e.g. --pin block_tokens=64 (repeatable).",
        kind="multiple",
        metavar="NAME=VALUE",
        convert=_pins,
    )
    slo_text: str | None = option(
        None,
        "--slo",
        help="Constraints in seconds, e.g. ttft_p99=5,ttft_mean=2,tpot_p99=0.1 "
        "[default: ttft_p99=2,tpot_p99=0.1].",
    )
    load: str = option(
        "trace",
        "--load",
        help="trace: serve the trace as recorded; capacity: the largest load "
        "meeting the SLO, priced at that rate.",
        kind="choice",
        choices=("trace", "capacity"),
        show_default=True,
    )
    objective: str = option(
        "cost",
        "--objective",
        help="What the search minimises under the SLO: cost per 1M tokens, or energy "
        "(joules per token).",
        kind="choice",
        choices=("cost", "energy"),
        show_default=True,
    )
    rate_scale: float = option(
        1.0,
        "--rate-scale",
        help="With --load trace: replay arrivals this many times as fast.",
        kind="float",
        show_default=True,
    )
    n_trials: int = option(
        60,
        "--trials",
        help="Trials the study should hold: a rerun of a finished study reports it, one cut "
        "short runs what it lacks; raise N to search further.",
        kind="int",
        minimum=1,
        show_default=True,
    )
    timeout: float | None = option(
        None,
        "--timeout",
        help="Stop starting trials after this many seconds.",
        kind="float",
        minimum=0,
        min_open=True,
    )
    n_jobs: int = option(
        1,
        "--jobs",
        help="Trials run at once, in threads.",
        kind="int",
        minimum=1,
        show_default=True,
    )
    seed: int = option(0, "--seed", help="Sampler seed.", kind="int", show_default=True)
    pareto: bool = option(
        False,
        "--pareto",
        help="NSGA-II on cost and TTFT P99; prints the Pareto front.",
        kind="flag",
    )
    study_name: str | None = option(
        None,
        "--study",
        help="Study name; running the same name again continues it "
        "[default: from trace, hardware and model].",
    )
    storage: str | None = option(
        None,
        "--storage",
        help="Optuna storage URL [default: sqlite:///runs/STUDY.db]; "
        "postgresql://... for many machines.",
    )
    allow_lossy_kv: bool = option(
        False,
        "--allow-lossy-kv",
        help="Let the search store KV in fp8 (changes model outputs slightly).",
        kind="flag",
    )
    compare_presets: bool = option(
        True,
        "--no-presets",
        help="Do not evaluate the built-in presets for comparison.",
        kind="flag",
        flag_value=False,
    )
    warm_start: bool = option(
        True,
        "--no-warm-start",
        help="Do not enqueue trials at the miss-ratio curve's knees.",
        kind="flag",
        flag_value=False,
    )
    refine: bool = option(
        True,
        "--no-refine",
        help="Do not refine the winner (shrink its tiers and instances while the SLO holds "
        "and the cost falls, and check that no single cheaper step meets the SLO).",
        kind="flag",
        flag_value=False,
    )
    out: str | None = option(
        None, "--out", help="Policy file to write [default: runs/STUDY.toml].", kind="file"
    )
    target: str | None = option(
        None,
        "--target",
        help="Search only what this serving system can express, so its export runs the "
        "simulated policy [default: search everything; the report names the targets "
        "that can run the winner].",
        kind="choice",
        choices=TARGET_CHOICES,
    )
    max_hosts: int | None = option(
        None,
        "--max-hosts",
        help="Let the search add hosts of the hardware profile, up to this many "
        "(cost counts the hosts a policy occupies) [default: the profile's hosts].",
        kind="int",
        minimum=1,
    )
    step_margin: float = option(
        0.0,
        "--step-time-margin",
        help="Also evaluate the winner with every engine step this share faster and slower "
        "(e.g. 0.1: 0.9x and 1.1x as long) and say whether it meets the SLO there.",
        kind="float",
        minimum=0,
        show_default=True,
    )
    prices: str | None = option(
        None,
        "--prices",
        help="TOML file of your own prices (GPU-hour, host-hour, per tier GB-hour and "
        "fabric host-hour; docs/search.md) [default: the profiles' owned all-in prices].",
        kind="file",
    )
    # set by callers, not by options
    runs_dir: Path = Path("runs")
    on_trial: Callable[[int, Any, Any], None] | None = field(default=None, compare=False)
    on_bound: Callable[[Any], None] | None = field(default=None, compare=False)


def cli_fields(cls: type = OptimizeRequest) -> list[tuple[str, CliOption]]:
    """``(field name, option)`` for every field of ``cls`` an option sets, in field order."""
    return [(f.name, f.metadata["cli"]) for f in fields(cls) if "cli" in f.metadata]


def request_values(values: Mapping[str, Any], cls: type = OptimizeRequest) -> dict[str, Any]:
    """The options' ``values`` (keyed by field name, as the generated options deliver them)
    as the fields take them: each through its option's ``convert``; keys that are not fields
    set by options pass through unchanged."""
    out = dict(values)
    for name, opt in cli_fields(cls):
        if name in out and opt.convert is not None:
            out[name] = opt.convert(out[name])
    return out


def request_from_options(values: Mapping[str, Any], **callers: Any) -> OptimizeRequest:
    """An :class:`OptimizeRequest` from the generated options' values and the callers' own
    fields (``runs_dir``, ``on_trial``, ``on_bound``)."""
    return OptimizeRequest(**request_values(values), **callers)
