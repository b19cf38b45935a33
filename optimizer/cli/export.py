"""``kvtier export``: a policy file as the configuration a serving system loads, with notes on
what it cannot express."""

from __future__ import annotations

import os
from typing import Any

import click
from rich.rule import Rule

from kvtier.cli.common import _console, _echo_json, policy_profile_options
from kvtier.errors import InputError
from kvtier.export import EXPORTERS

EXPORT_TARGETS = EXPORTERS.names  # the exporter registry (kvtier.export)


@click.command("export")
@click.argument("policy_path", metavar="POLICY.toml", type=click.Path(dir_okay=False))
@click.option(
    "--target",
    required=True,
    type=click.Choice([*EXPORT_TARGETS, "all"]),
    help="Serving system to export for, or all of them.",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write the files to this directory (all: one subdirectory per target) "
    "[default: print them].",
)
@policy_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print target, files and notes as JSON.")
def export_cmd(
    policy_path: str,
    target: str,
    out_dir: str | None,
    hardware: str | None,
    model: str | None,
    as_json: bool,
) -> None:
    """Turn a policy file into the configuration vLLM, LMCache, SGLang, Dynamo or Mooncake
    loads, with notes on every setting the target cannot express (docs/export.md)."""
    from kvtier.export import export
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.file import read_policy_file
    from kvtier.scenario import hardware_name, model_name

    policy = read_policy_file(policy_path).policy
    hw = load_hardware(hardware_name(hardware, policy))
    mdl = load_model(model_name(model, policy))
    targets = EXPORT_TARGETS if target == "all" else (target,)
    try:
        results = [export(policy, t, hw, mdl) for t in targets]
    except InputError as err:
        raise err.with_path(policy_path) from None
    written: dict[str, list[str]] = {}
    if out_dir is not None:
        from kvtier.files import guard_outputs

        planned = {
            f"-o ({os.path.join(r.target, name) if target == 'all' else name})": os.path.join(
                out_dir, r.target if target == "all" else "", name
            )
            for r in results
            for name in [*r.files, "notes.txt"]
        }
        guard_outputs(planned, {"POLICY.toml": policy_path, "--hardware": hardware,
                                "--model": model})  # fmt: skip
        for r in results:
            sub = os.path.join(out_dir, r.target) if target == "all" else out_dir
            written[r.target] = _write_export(sub, r)
    if as_json:
        docs = [
            {**r.as_json(), **({"written": written[r.target]} if written else {})} for r in results
        ]
        _echo_json(docs[0] if len(docs) == 1 else docs)
        return
    console = _console()
    for r in results:
        if out_dir is None:
            for name, text in r.files.items():
                console.print(
                    Rule(f"[bold]{r.target}[/bold]: {name}", align="left"),
                    width=min(console.width, 100),
                )
                click.echo(text, nl=False)  # verbatim: rich would wrap long lines
        else:
            for path in written[r.target]:
                click.echo(f"wrote {path}")
        console.print(
            Rule(f"[bold]{r.target}[/bold]: what it cannot express", align="left"),
            width=min(console.width, 100),
        )
        for note in r.notes:
            console.print(_note_line(note), markup=False, highlight=False)


def _note_line(note: Any) -> str:
    """``- text``, with the kind in front of a note that is not informational."""
    kind = getattr(note, "kind", "informational")
    return f"- {note}" if kind == "informational" else f"- [{kind}] {note}"


def _write_export(directory: str, result: Any) -> list[str]:
    """Write ``result``'s files and its notes (``notes.txt``) into ``directory`` atomically."""
    from pathlib import Path

    from kvtier.files import atomic_write

    files = dict(result.files)
    files["notes.txt"] = "".join(f"{_note_line(n)}\n" for n in result.notes)
    paths = []
    for name, text in files.items():
        path = Path(directory) / name
        try:
            atomic_write(path, lambda tmp, text=text: Path(tmp).write_text(text))
        except OSError as err:
            raise InputError(f"cannot write {path}: {err.strerror or err}", option="-o") from None
        if name.endswith(".sh"):
            path.chmod(path.stat().st_mode | 0o111)
        paths.append(str(path))
    return paths
