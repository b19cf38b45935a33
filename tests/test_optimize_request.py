"""``optimize``'s options are generated from the fields of ``OptimizeRequest``."""

from __future__ import annotations

from dataclasses import fields

import click
import pytest

from kvtier.cli import main, optimize_main
from kvtier.search.request import OptimizeRequest, cli_fields, request_from_options


def _options(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params if isinstance(p, click.Option)}


def test_every_request_field_with_an_option_is_an_option_of_optimize_and_batch() -> None:
    declared = dict(cli_fields())
    assert "trace_path" in declared and "refine" in declared
    for command in (main.commands["optimize"], optimize_main):
        opts = _options(command)
        extra = (
            {"as_json", "quiet", "version"} if command is optimize_main else {"as_json", "quiet"}
        )
        assert set(opts) == set(declared) | extra, command.name
        for name, opt in declared.items():
            assert list(opts[name].opts) == [opt.decls[0]], name
            assert opts[name].help == opt.help, name
    batch = _options(main.commands["batch"])
    assert set(declared) - set(batch) == {"trace_path", "study_name", "out"}


def test_defaults_agree_between_the_command_and_the_request() -> None:
    opts = _options(main.commands["optimize"])
    for f in fields(OptimizeRequest):
        if "cli" not in f.metadata or f.name in ("trace_path", "pins"):
            continue
        default = opts[f.name].default
        if opts[f.name].is_flag and not isinstance(default, bool):  # click's unset: False
            default = False
        assert default == f.default, f.name
    assert opts["pins"].multiple


def test_the_options_values_become_a_request_with_pins_parsed() -> None:
    values = {name: _options(main.commands["optimize"])[name].default for name, _ in cli_fields()}
    values.update(trace_path="t.parquet", pins=("block_tokens=64",), n_trials=3)
    request = request_from_options(values)
    assert request.pins == {"block_tokens": 64}
    assert request.n_trials == 3 and request.refine and request.compare_presets
    from kvtier.errors import InputError

    with pytest.raises(InputError, match="--pin"):
        request_from_options({**values, "pins": ("no_such_key=1",)})


def test_flags_that_switch_off_set_their_field_false() -> None:
    from click.testing import CliRunner

    seen: dict = {}

    @click.command()
    def probe(**kwargs) -> None:
        seen.update(kwargs)

    from kvtier.cli.optimize import _optimize_options

    command = _optimize_options(probe)
    result = CliRunner().invoke(
        command, ["--trace", "t.parquet", "--no-refine", "--no-presets", "--pareto"]
    )
    assert result.exit_code == 0, result.output
    cli_only = ("as_json", "quiet")  # the command's own: output, not the request
    request = request_from_options({k: v for k, v in seen.items() if k not in cli_only})
    assert request.refine is False and request.compare_presets is False and request.pareto
    assert request.warm_start is True
