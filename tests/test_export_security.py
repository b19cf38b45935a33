"""Exported launch scripts run nothing they were not meant to: hostile values stay data.

A model or hardware profile's ``name``, and the paths and hosts the exporters place in their
files, reach generated shell scripts and environment files. Each is fed a value that would
create a sentinel file if any shell ever evaluated it; every script is checked with ``sh -n``
and executed, with and without ``MODEL`` set, on a ``PATH`` of stub commands (so no server
starts), and the sentinel must never appear.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from kvtier.export import EXPORTERS, export
from kvtier.export import common as export_common
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, TierPolicy

STUBS = ("vllm", "python3", "mooncake_master")


def hostile(sentinel: Path) -> list[str]:
    """Texts that run ``touch SENTINEL`` wherever a shell evaluates them unquoted."""
    s = shlex.quote(str(sentinel))
    return [
        f"Q$(touch {s})",
        f"Q`touch {s}`",
        f"Q'; touch {s}; '",
        f'Q"; touch {s}; "',
        f"Q}}$(touch {s})",
        f"Q\ntouch {s}\n",
        f"Q\r\ntouch {s}",
        f"-Q && touch {s}",
        f"Q${{X:-$(touch {s})}}",
    ]


def stub_path(tmp_path: Path) -> Path:
    """A directory of stand-ins for the serving commands: each records its argv and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv-{name}"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def run_script(path: Path, bin_dir: Path, model: str | None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(path.parent)}
    if model is not None:
        env["MODEL"] = model
    return subprocess.run(
        ["/bin/sh", str(path)], env=env, capture_output=True, text=True, timeout=30
    )


def every_tier_policy() -> Policy:
    tiers = tuple(TierPolicy(name=n) for n in ("dram", "cxl", "rdma", "ssd"))
    return Policy(tiers=(TierPolicy(), *tiers))


def exported_files(policy: Policy, hardware, model) -> dict[str, dict[str, str]]:  # noqa: ANN001
    out = {}
    for target in EXPORTERS.names:
        out[target] = export(policy, target, hardware, model).files
    return out


@pytest.mark.parametrize("index", range(9))
def test_hostile_names_paths_and_hosts_never_run(tmp_path: Path, monkeypatch, index: int) -> None:
    sentinel = tmp_path / "PWNED"
    text = hostile(sentinel)[index]
    model = replace(load_model("Llama-3.1-8B"), name=text)
    hardware = replace(load_hardware("beluga-testbed"), name=text)
    # Placeholders the exporters write: paths and hosts.
    from kvtier.export import lmcache, mooncake, sglang

    monkeypatch.setattr(sglang, "FILE_DIR", f"/tmp/{text}")
    monkeypatch.setattr(mooncake, "OFFLOAD_DIR", f"/tmp/{text}")
    policies = [every_tier_policy(), Policy(), Policy(tiers=(TierPolicy(), TierPolicy("ssd")))]
    bin_dir = stub_path(tmp_path)
    scripts = 0
    for p in policies:
        for target, files in exported_files(p, hardware, model).items():
            out = tmp_path / f"{target}-{scripts}"
            out.mkdir()
            for name, content in files.items():
                path = out / name
                path.write_text(content)
                if name.endswith(".sh"):
                    scripts += 1
                    syntax = subprocess.run(
                        ["sh", "-n", str(path)], capture_output=True, timeout=30
                    )
                    assert syntax.returncode == 0, (name, syntax.stderr, content)
                    if '"$MODEL"' in content:
                        unset = run_script(path, bin_dir, None)
                        assert unset.returncode == 2 and "set MODEL" in unset.stderr, unset
                    ran = run_script(path, bin_dir, text)
                    assert ran.returncode == 0, (name, ran.stderr, content)
                if name.endswith(".env"):
                    sourced = subprocess.run(
                        ["/bin/sh", "-c", f"set -a; . {shlex.quote(str(path))}; set +a"],
                        env={"PATH": "/usr/bin:/bin"},
                        capture_output=True,
                        timeout=30,
                    )
                    assert sourced.returncode == 0, (name, sourced.stderr, content)
                assert not sentinel.exists(), (target, name, content)
    assert scripts >= 4
    del lmcache  # imported so every exporter module is loaded under the patches


def test_the_model_word_reaches_the_command_verbatim(tmp_path: Path) -> None:
    """``$MODEL`` is passed as one argument, whatever it holds; the profile name only reaches
    the refusal message, quoted."""
    sentinel = tmp_path / "PWNED"
    name = f"Q$(touch {sentinel})"
    model = replace(load_model("Llama-3.1-8B"), name=name)
    hardware = load_hardware("h100-node")
    text = export(Policy(), "vllm", hardware, model).files["vllm-serve.sh"]
    path = tmp_path / "vllm-serve.sh"
    path.write_text(text)
    bin_dir = stub_path(tmp_path)
    checkpoint = "/models/a b/$(touch x)"
    ran = run_script(path, bin_dir, checkpoint)
    assert ran.returncode == 0, ran.stderr
    argv = (tmp_path / "argv-vllm").read_text().splitlines()
    assert argv[:2] == ["serve", checkpoint] and "--block-size" in argv
    unset = run_script(path, bin_dir, None)
    assert unset.stderr.strip() == f"set MODEL to the checkpoint of {name}"
    assert not sentinel.exists() and not (tmp_path / "x").exists()


def test_env_values_round_trip_through_the_shell(tmp_path: Path) -> None:
    sentinel = tmp_path / "PWNED"
    env = {"A_PATH": f"/x/$(touch {sentinel})", "PLAIN": "12345", "SPACED": "a b"}
    text = export_common.env_file(env, ["two\nlines"])
    assert "PLAIN=12345\n" in text  # plain values stay as --env-file takes them
    path = tmp_path / "x.env"
    path.write_text(text)
    probe = 'printf "%s|%s|%s" "$A_PATH" "$PLAIN" "$SPACED"'
    out = subprocess.run(
        ["/bin/sh", "-c", f"set -a; . {shlex.quote(str(path))}; {probe}"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout == f"{env['A_PATH']}|12345|a b" and not sentinel.exists()


@pytest.mark.parametrize("index", [0, 1, 2, 7, 8])  # one-line values
def test_hostile_host_index_hostname_and_master_stay_data(tmp_path: Path, index: int) -> None:
    """The variables a user sets for the launch and store-client scripts (``HOST_INDEX``,
    ``LOCAL_HOSTNAME``, ``MOONCAKE_MASTER``) are never evaluated: a bad ``HOST_INDEX`` is
    refused (exit 2), the others reach the command as single arguments."""
    sentinel = tmp_path / "PWNED"
    text = hostile(sentinel)[index]
    bin_dir = stub_path(tmp_path)
    scripts = 0
    for target, files in exported_files(
        every_tier_policy(), load_hardware("beluga-testbed"), load_model("Llama-3.1-8B")
    ).items():
        out = tmp_path / target
        out.mkdir()
        for name, content in files.items():
            (out / name).write_text(content)
        for name in files:
            if not name.endswith(".sh"):
                continue
            scripts += 1
            env = {
                "PATH": f"{bin_dir}:/usr/bin:/bin",
                "HOME": str(out),
                "MODEL": "m",
                "HOST_INDEX": text,
                "LOCAL_HOSTNAME": text,
                "MOONCAKE_MASTER": text,
            }
            ran = subprocess.run(
                ["/bin/sh", str(out / name)], env=env, capture_output=True, text=True, timeout=30
            )
            if "HOST_INDEX" in files[name]:
                assert ran.returncode == 2 and "HOST_INDEX is the host" in ran.stderr, ran
            else:
                assert ran.returncode == 0, (name, ran.stderr)
            assert not sentinel.exists(), (target, name)
    argv = (tmp_path / "argv-python3").read_text().splitlines()  # the store client ran last
    assert argv[-2:] == [f"-Dlocal_hostname={text}", f"-Dmaster_server_address={text}"]
    assert scripts >= 5
