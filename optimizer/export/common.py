"""What every exporter shares: the result type, the deployment a policy describes, size helpers.

A kvtier policy sizes its tiers the way the simulator pools them (``docs/policy.md``): HBM per
instance, ``dram`` and ``ssd`` per host, ``cxl`` and ``rdma`` for the whole pool. Serving systems
size per process instead (one vLLM or SGLang instance, one tensor-parallel rank, one Mooncake
store client), so :class:`Deployment` places the instances on hosts exactly as the simulator does
(``optimizer/sim/tiers.py``: instance ``k`` runs on host ``k * tp // gpus_per_host``) and splits
every pool into those shares. Exporters then only convert units and spell keys.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from dataclasses import dataclass, field

from kvtier.deploy.layout import Layout
from kvtier.errors import InputError
from kvtier.hardware.types import GB, Hardware, ModelProfile
from kvtier.policy.model import Policy

GIB = float(1 << 30)


# The kinds of an export note: what the search (``optimize --target``, the targets that run a
# winner) reads instead of the notes' prose.
INEXPRESSIBLE = "inexpressible"  # the deployed system would not do what was simulated
APPROXIMATE = "approximate"  # it does something close, said how
INFORMATIONAL = "informational"  # an assumption, a placeholder, how to run the files
NOTE_KINDS = (INEXPRESSIBLE, APPROXIMATE, INFORMATIONAL)


class Note(str):
    """One export note: its text (the string itself) and its :data:`kind <NOTE_KINDS>`."""

    kind: str

    def __new__(cls, text: str, kind: str = INFORMATIONAL) -> Note:
        if kind not in NOTE_KINDS:
            raise ValueError(f"note kind {kind!r} is not one of {', '.join(NOTE_KINDS)}")
        note = super().__new__(cls, text)
        note.kind = kind
        return note

    def prefixed(self, prefix: str) -> Note:
        """The same note, its text after ``prefix``."""
        return Note(prefix + self, self.kind)

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": str(self)}


def inexpressible(text: str) -> Note:
    """A setting the target cannot express: its deployment would not run what was simulated."""
    return Note(text, INEXPRESSIBLE)


def approximate(text: str) -> Note:
    """A setting the target expresses only approximately (the note says how)."""
    return Note(text, APPROXIMATE)


def info(text: str) -> Note:
    """An assumption, placeholder or instruction: nothing simulated is lost."""
    return Note(text, INFORMATIONAL)


@dataclass(frozen=True)
class ExportResult:
    """Files a target loads (name -> text), structured notes (:class:`Note`) on what it
    cannot express or only approximates, and the releases the files are written for."""

    target: str
    files: dict[str, str] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    release: str = ""  # "vllm 0.34.0, lmcache 0.5.6": the releases whose names the files use

    def __post_init__(self) -> None:
        notes = [n if isinstance(n, Note) else info(n) for n in self.notes]
        object.__setattr__(self, "notes", notes)

    def of_kind(self, kind: str) -> list[Note]:
        return [n for n in self.notes if n.kind == kind]

    @property
    def expressible(self) -> bool:
        """No note says a setting could not be expressed."""
        return not self.of_kind(INEXPRESSIBLE)

    def as_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "release": self.release,
            "files": dict(self.files),
            "notes": [n.as_json() for n in self.notes],
        }


@dataclass(frozen=True)
class Deployment:
    """A policy placed on a hardware profile: instances, hosts, and each tier's pool bytes."""

    policy: Policy
    hardware: Hardware
    model: ModelProfile
    instances: int
    tp: int
    instances_per_host: int  # on the fullest host; the last host may hold fewer
    hosts: int
    uneven: bool  # the last host holds fewer instances than the others
    hbm_kv_bytes: float  # per instance
    pool_bytes: dict[str, float]  # per pool: per host for per-host tiers, else the whole pool
    per_host: dict[str, bool]
    # where each instance runs and with how many GPUs (per-pool tensor parallelism: prefill
    # instances of one tp, decode instances of another); None: ``tp`` GPUs each, consecutive
    layout: Layout | None = None
    decode_hbm_kv_bytes: float | None = None  # per decode instance, when its tp differs
    # every instance holds the lower tiers, decode ones included (LMCache's own P/D backend,
    # whose consumers keep an LMCache engine too); else only the prefill instances do
    every_instance_holds_tiers: bool = False

    def tp_of(self, instance: int) -> int:
        """GPUs of ``instance`` (its pool's tensor-parallel size)."""
        return self.tp if self.layout is None else self.layout.tp_of(instance)

    def hbm_kv_bytes_of(self, instance: int) -> float:
        """HBM KV bytes of ``instance`` (its pool's)."""
        if self.layout is not None and self.layout.mixed and instance >= self.layout.n_prefill:
            return float(self.decode_hbm_kv_bytes or self.hbm_kv_bytes)
        return self.hbm_kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.policy.kv_dtype)

    def has(self, tier: str) -> bool:
        return tier in self.pool_bytes

    def host_of(self, instance: int) -> int:
        """The host ``instance`` runs on (the simulator's placement)."""
        if self.layout is not None:
            return self.layout.host_of(instance)
        return instance * self.tp // self.hardware.topology.gpus_per_host

    @property
    def tier_users(self) -> list[int]:
        """The instances that look the lower tiers up and write them: every instance, or the
        prefill instances of a disaggregated policy (the simulator's P/D hand-off,
        docs/model.md)."""
        from kvtier.policy.model import prefill_count

        n = (
            self.layout.n_prefill
            if self.layout is not None
            else prefill_count(self.policy.serving, self.instances)
        )
        if self.every_instance_holds_tiers:
            n = 0
        return list(range(n)) if n else list(range(self.instances))

    @property
    def tier_ranks(self) -> int:
        """Tensor-parallel ranks of the :attr:`tier_users` (each holds its own share)."""
        return sum(self.tp_of(k) for k in self.tier_users)

    def users_on_host(self, host: int) -> int:
        return sum(1 for k in self.tier_users if self.host_of(k) == host)

    def per_instance_bytes(self, tier: str, instance: int | None = None) -> float:
        """An instance's share of a tier: its host's pool over the host's instances that use
        the tiers (:attr:`tier_users`), or the shared pool over all of them. Without
        ``instance``: the share on the fullest host, so that no share is larger than its
        host's pool allows."""
        users = self.tier_users
        if self.per_host[tier]:
            if instance is None:
                count = max(self.users_on_host(self.host_of(k)) for k in users)
            else:
                count = self.users_on_host(self.host_of(instance))
            return self.pool_bytes[tier] / count
        return self.pool_bytes[tier] / len(users)

    def per_rank_bytes(self, tier: str) -> float:
        """A tensor-parallel rank's share: the instance share over ``tp`` (KV is sharded)."""
        return self.per_instance_bytes(tier) / self.tp

    def per_host_bytes(self, tier: str) -> float:
        """A host's share: its own pool, or the shared pool spread evenly over the hosts."""
        if self.per_host[tier]:
            return self.pool_bytes[tier]
        return self.pool_bytes[tier] / self.hosts

    def describe(self) -> str:
        uneven = " (the last host fewer)" if self.uneven else ""
        if self.layout is not None and self.layout.mixed:
            n_pf = self.layout.n_prefill
            return (
                f"{n_pf} prefill instance(s) of tp={self.layout.prefill_tp} and "
                f"{self.instances - n_pf} decode instance(s) of tp={self.layout.decode_tp} on "
                f"{self.hosts} host(s), at most {self.instances_per_host} per host"
            )
        return (
            f"{self.instances} instance(s) of tp={self.tp} on {self.hosts} host(s), "
            f"{self.instances_per_host} per host{uneven}"
        )


def deployment(policy: Policy, hardware: Hardware, model: ModelProfile) -> Deployment:
    """Place ``policy`` on ``hardware``; impossible placements raise :class:`InputError`,
    with the same checks (and messages) as the simulator."""
    from kvtier.deploy.apply import apply_deployment
    from kvtier.deploy.kv_budget import kv_budget
    from kvtier.deploy.layout import plan_layout

    hardware, model = apply_deployment(hardware, model, policy)  # serving.tp, weight_dtype
    layout = plan_layout(hardware.topology, policy.serving, hardware.name)  # as the simulator
    n = layout.n_instances
    hosts_of = Counter(layout.host_of(k) for k in range(n))
    hbm = policy.tiers[0]

    def hbm_kv(tp: int) -> float:  # as the simulator sizes it (kvtier.sim.config._pool)
        if hbm.capacity_gb is not None:
            return hbm.capacity_gb * GB
        return kv_budget(hardware, model, policy, tp).kv_bytes

    hbm_bytes = hbm_kv(layout.prefill_tp)
    pools: dict[str, float] = {}
    per_host: dict[str, bool] = {}
    for tier in policy.lower_tiers:
        hw = hardware.tiers.get(tier.name)
        if hw is None:
            raise InputError(
                f"policy lists tier {tier.name!r} but hardware {hardware.name!r} has no "
                f"[tiers.{tier.name}] table"
            )
        pools[tier.name] = (
            tier.capacity_gb * GB if tier.capacity_gb is not None else hw.capacity_bytes
        )
        per_host[tier.name] = hw.per_host
    counts = list(hosts_of.values())
    return Deployment(
        policy=policy,
        hardware=hardware,
        model=model,
        instances=n,
        tp=layout.prefill_tp,
        instances_per_host=max(counts),
        hosts=len(counts),
        uneven=min(counts) != max(counts),
        hbm_kv_bytes=float(hbm_bytes),
        pool_bytes=pools,
        per_host=per_host,
        layout=layout,
        decode_hbm_kv_bytes=float(hbm_kv(layout.decode_tp)) if layout.mixed else None,
    )


def gib(n_bytes: float, digits: int = 3) -> float:
    """Bytes as GiB (2**30), rounded down to ``digits`` decimals so a size never grows."""
    scale = 10**digits
    return math.floor(n_bytes / GIB * scale) / scale


def gb(n_bytes: float, digits: int = 3) -> float:
    """Bytes as decimal GB (1e9), rounded down to ``digits`` decimals."""
    scale = 10**digits
    return math.floor(n_bytes / GB * scale) / scale


def decimal(x: float) -> str:
    """``x`` in plain decimal notation without trailing zeros (``:g`` would round 1000.125)."""
    text = f"{x:.6f}".rstrip("0").rstrip(".")
    return text or "0"


class ShellVar(str):
    """A word of a generated script that is a shell variable the user must set (``"$MODEL"``).

    It is the only word a script does not pass through :func:`shlex.quote`. Its ``hint`` (the
    message when the variable is unset) is data, so :func:`shell_command` writes it on a line
    of its own, quoted, instead of inside a ``"${VAR:?...}"`` word, where a ``$(...)`` in a
    profile's name would run.
    """

    var: str
    hint: str
    fallback: str | None

    def __new__(cls, var: str, hint: str, fallback: str | None = None) -> ShellVar:
        """``fallback``: a fixed command of kvtier's own (never text from a file) whose output
        the variable takes when unset, instead of refusing to start."""
        if not var.isidentifier() or not var.isascii():
            raise ValueError(f"not a shell variable name: {var!r}")
        word = super().__new__(cls, f'"${var}"')
        word.var = var
        word.hint = hint
        word.fallback = fallback
        return word


def _comment(text: str) -> str:
    """One comment line: a line break in ``text`` (from a profile name) would end the comment
    and make the rest a command."""
    return "# " + " ".join(text.split())


def shell_command(env: dict[str, str], argv: list[str], comments: list[str]) -> str:
    """A POSIX ``sh`` script: comment lines, exported variables, one command, one flag a line.

    Every value is quoted with :func:`shlex.quote`: names, paths and hosts come from profile
    and policy files, which may be hostile. A :class:`ShellVar` word is the one exception: it
    expands a variable the user sets, and the script refuses to start (with the quoted hint)
    when it is unset or empty.
    """

    lines = ["#!/bin/sh", *(_comment(c) for c in comments)]
    lines += _var_guards([*env.values(), *argv])
    lines += [f"export {_env_key(k)}={_quote(v)}" for k, v in env.items()]
    lines.append(f"exec {_command_body(argv, '')}")
    return "\n".join(lines) + "\n"


def _quote(word: str) -> str:
    return str(word) if isinstance(word, ShellVar) else shlex.quote(word)


def _command_body(argv: list[str], indent: str) -> str:
    """``argv`` quoted: the leading words on the first line, then one flag (and value) a line."""
    head: list[str] = []
    flags: list[str] = []
    i = 0
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(_quote(argv[i]))
        i += 1
    while i < len(argv):
        word = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and not nxt.startswith("--"):
            flags.append(f"{_quote(word)} {_quote(nxt)}")
            i += 2
        else:
            flags.append(_quote(word))
            i += 1
    body = " ".join(head)
    if flags:
        sep = f" \\\n{indent}  "
        body += sep + sep.join(flags)
    return body


def _var_guards(words: list[str]) -> list[str]:
    """Refuse to start (the quoted hint, exit 2) while a :class:`ShellVar` is unset or empty."""
    lines: list[str] = []
    for word in dict.fromkeys(w for w in words if isinstance(w, ShellVar)):
        if word.fallback is not None:
            lines.append(f'if [ -z "${{{word.var}:-}}" ]; then {word.var}=$({word.fallback}); fi')
            continue
        lines += [
            f'if [ -z "${{{word.var}:-}}" ]; then',
            f"  printf '%s\\n' {shlex.quote(word.hint)} >&2",
            "  exit 2",
            "fi",
        ]
    return lines


@dataclass(frozen=True)
class Placement:
    """Where one instance runs: its host and the GPUs it takes there (``CUDA_VISIBLE_DEVICES``).

    The simulator's layout (``optimizer/sim/tiers.py``): instance ``k`` takes GPUs
    ``k * tp`` to ``k * tp + tp - 1`` counted over all hosts, so it runs on host
    ``k * tp // gpus_per_host`` with that host's GPUs from ``k * tp % gpus_per_host`` on.
    """

    instance: int
    host: int
    gpus: tuple[int, ...]

    @property
    def visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))


def placements(deploy: Deployment) -> list[Placement]:
    """Every instance of ``deploy`` with its host and GPUs."""
    per_host = deploy.hardware.topology.gpus_per_host
    out = []
    for k in range(deploy.instances):
        tp = deploy.tp_of(k)
        first = deploy.layout.first_gpu[k] if deploy.layout is not None else k * tp
        local = first % per_host
        if local + tp > per_host:
            raise InputError(
                f"tp={tp} does not fit the {per_host} GPUs of a host of hardware "
                f"{deploy.hardware.name!r}: a launch script starts each instance on one host",
                option="serving.tp",
            )
        out.append(Placement(k, first // per_host, tuple(range(local, local + tp))))
    return out


@dataclass(frozen=True)
class Job:
    """One process a launch script starts in the background on ``host``, with its own
    variables (GPUs, ports) in front of the command, announced by ``label`` on stderr."""

    host: int
    env: dict[str, str]
    argv: list[str]
    label: str


def launch_script(
    comments: list[str],
    env: dict[str, str],
    file_env: dict[str, str],
    jobs: list[Job],
    hosts: int,
) -> str:
    """A POSIX ``sh`` script that starts the jobs of the host it runs on in the background and
    waits for them; its exit status is the first failing job's, else 0.

    ``HOST_INDEX`` (0 when unset; anything but ``0`` .. ``hosts - 1`` exits 2) selects the
    host. ``file_env`` maps a variable to a file exported beside the script; its value is that
    file's absolute path, resolved from the script's own directory (``"$(dirname "$0")"``) when
    the script runs, so the exported directory can be moved or copied to each host whole.
    Every value is quoted (:func:`shlex.quote`); ``INT`` and ``TERM`` stop every job.
    """
    lines = ["#!/bin/sh", *(_comment(c) for c in comments)]
    lines.append('HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1')
    words = [*env.values(), *(w for job in jobs for w in [*job.env.values(), *job.argv])]
    lines += _var_guards(words)
    lines += [f"export {_env_key(k)}={_quote(v)}" for k, v in env.items()]
    lines += [f'export {_env_key(k)}="$HERE"/{shlex.quote(v)}' for k, v in file_env.items()]
    hint = f"HOST_INDEX is the host this script runs on, 0 to {hosts - 1}"
    lines += [
        'HOST_INDEX="${HOST_INDEX:-0}"',
        'case "$HOST_INDEX" in',
        f"  {'|'.join(str(h) for h in range(hosts))}) ;;",
        f"  *) printf '%s\\n' {shlex.quote(hint)} >&2; exit 2 ;;",
        "esac",
        "pids=",
        "trap 'kill $pids 2>/dev/null; exit 130' INT TERM",
    ]
    for host in range(hosts):
        mine = [j for j in jobs if j.host == host]
        if not mine:
            continue
        lines.append(f'if [ "$HOST_INDEX" = {host} ]; then')
        for job in mine:
            lines.append(f"  printf '%s\\n' {shlex.quote(' '.join(job.label.split()))} >&2")
            prefix = "".join(f"{_env_key(k)}={_quote(v)} \\\n  " for k, v in job.env.items())
            lines.append(f"  {prefix}{_command_body(job.argv, '  ')} &")
            lines.append('  pids="$pids $!"')
        lines.append("fi")
    lines += [
        "status=0",
        "for pid in $pids; do",
        '  wait "$pid"',
        "  rc=$?",
        '  if [ "$status" -eq 0 ]; then status=$rc; fi',
        "done",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def _env_key(key: str) -> str:
    if not key.isidentifier() or not key.isascii():
        raise ValueError(f"not an environment variable name: {key!r}")
    return key


def env_file(env: dict[str, str], comments: list[str]) -> str:
    """``KEY=value`` lines (usable with ``set -a; . FILE`` or a container ``--env-file``).

    Values are quoted with :func:`shlex.quote`, so sourcing the file runs nothing; a plain
    value (a number, a path of ordinary characters) stays unquoted, as ``--env-file`` takes
    quotes literally.
    """
    lines = [_comment(c) for c in comments]
    lines += [f"{_env_key(k)}={shlex.quote(v)}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def model_word(deploy: Deployment) -> ShellVar:
    """The served-model argument: the user's ``$MODEL``, which must be set."""
    return ShellVar("MODEL", f"set MODEL to the checkpoint of {deploy.model.name}")


def shared_notes(deploy: Deployment, target: str) -> list[str]:
    """Notes that hold for every target: kvtier settings no serving system reads."""
    p = deploy.policy
    notes = [
        f"Sizes assume {deploy.describe()} on hardware {deploy.hardware.name!r}, "
        f"model {deploy.model.name!r} ({deploy.kv_bytes_per_token:,} KV bytes per token, "
        f"{p.kv_dtype})."
    ]
    if p.load_rule == "cost_aware":
        notes.append(
            inexpressible(
                f"load_rule = cost_aware (load a hit only when faster than recomputing it) is a "
                f"kvtier rule; {target} has no equivalent setting and loads every hit it finds."
            )
        )
    if p.load_wait == "batch" and p.lower_tiers and target not in ("LMCache", "vLLM"):
        notes.append(
            approximate(
                f"load_wait = batch describes LMCache's synchronous retrieve (the batch waits for "
                f"every load); {target} has no setting for it."
            )
        )
    if p.coalesce != 1:
        notes.append(
            approximate(
                f"coalesce = {p.coalesce} (fragments merged per transfer) is not a setting of "
                f"{target}; transfer batching is internal to it."
            )
        )
    if p.share_across_tenants:
        notes.append(
            info(
                f"share_across_tenants = true needs no setting in {target}: blocks are shared "
                "whenever prompts match."
            )
        )
    else:
        notes.append(
            approximate(
                f"share_across_tenants = false (tenants never share blocks) is not a setting of "
                f"{target}: isolate tenants with separate deployments or per-request cache salts."
            )
        )
    if p.serving.token_ids_io:
        notes.append(
            info(
                f"serving.token_ids_io = true describes clients that send token ids and read ids "
                f"back; {target} needs no setting for it (its completions endpoint takes ids), "
                "and clients that send text pay the tokenization the simulation left out."
            )
        )
    if p.serving.attention_backend != "default" and target != "SGLang":
        notes.append(
            approximate(
                f"serving.attention_backend = {p.serving.attention_backend} is SGLang's "
                f"--attention-backend; {target} runs its own attention kernels, whose prefill "
                "the simulation timed slower."
            )
        )
    if p.serving.weights_in_hbf:
        notes.append(
            inexpressible(
                f"serving.weights_in_hbf = true (weights kept in high-bandwidth flash beside "
                f"each GPU) is hardware no {target} release drives; the weights are loaded into "
                "HBM, which leaves fewer KV blocks than simulated."
            )
        )
    hetero = p.serving.prefill_gpu is not None or deploy.hardware.prefill_gpu is not None
    if hetero and deploy.layout is not None and deploy.layout.n_prefill:
        notes.append(
            inexpressible(
                f"the prefill instances ran on another GPU type than the decode instances; "
                f"{target}'s launch scripts name no GPU type: place each role's workers on "
                "the intended GPUs yourself."
            )
        )
    cxl = p.tier("cxl")
    if cxl is not None and cxl.interleave is not None:
        notes.append(
            inexpressible(
                f"cxl interleave = {str(cxl.interleave).lower()} is a property of the CXL "
                "device configuration, not of the serving software; it is not exported."
            )
        )
    return notes
