"""Where a policy's instances sit: how many of each pool, their tensor-parallel size, GPUs, hosts.

A disaggregated policy may shard its prefill and its decode instances over different GPU
counts (``serving.prefill_tp`` / ``serving.decode_tp``, default ``serving.tp``), as Dynamo's
and vLLM's P/D deployments launch each role with its own ``--tensor-parallel-size``. The
simulator (:func:`kvtier.sim.config.build_config`: capacity, step times, lower-tier links, the
P/D link, cost) and the exporters (:func:`kvtier.export.common.deployment`: GPU sets,
worker counts) read the same :class:`Layout`, so both place an instance on the same GPUs.

Placement (docs/model.md, "Per-pool tensor parallelism"): prefill instances first, then decode
instances, each on consecutive GPUs. With one tp for every instance the GPUs of instance ``k``
are ``[k * tp, (k + 1) * tp)``, as before per-pool tp existed. With two sizes an instance of at
most a host's GPUs never spans hosts: it starts on the next host when the current one has too
few GPUs left (first fit, in order); a size above a host's GPUs must be a multiple of them and
starts on a host boundary (it spans whole hosts, as a single tp of that size already does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtier.errors import InputError
from kvtier.hardware.types import Topology

if TYPE_CHECKING:
    from kvtier.policy.model import ServingPolicy


@dataclass(frozen=True)
class Layout:
    """The instances of one deployment: ``n_prefill`` prefill instances of ``prefill_tp`` GPUs
    (0: aggregated), then decode (or aggregated) instances of ``decode_tp`` GPUs."""

    n_instances: int
    n_prefill: int
    prefill_tp: int
    decode_tp: int
    first_gpu: tuple[int, ...]  # per instance, a global GPU index (host * gpus_per_host + local)
    gpus_per_host: int

    @property
    def mixed(self) -> bool:
        """The two pools shard over different GPU counts."""
        return self.n_prefill > 0 and self.prefill_tp != self.decode_tp

    def tp_of(self, k: int) -> int:
        return self.prefill_tp if k < self.n_prefill else self.decode_tp

    @property
    def tps(self) -> tuple[int, ...]:
        return tuple(self.tp_of(k) for k in range(self.n_instances))

    def host_of(self, k: int) -> int:
        """The host of instance ``k``'s first GPU."""
        return self.first_gpu[k] // self.gpus_per_host

    @property
    def gpus(self) -> int:
        """GPUs the instances use."""
        return self.n_prefill * self.prefill_tp + (self.n_instances - self.n_prefill) * (
            self.decode_tp
        )

    @property
    def hosts(self) -> int:
        """Hosts with at least one used GPU (every host up to the last used GPU's)."""
        if not self.n_instances:
            return 0
        last = max(g + t for g, t in zip(self.first_gpu, self.tps, strict=True)) - 1
        return last // self.gpus_per_host + 1

    def gpu_ids(self, k: int) -> tuple[int, ...]:
        """Instance ``k``'s GPUs, global indices."""
        return tuple(range(self.first_gpu[k], self.first_gpu[k] + self.tp_of(k)))


def pool_tp_choices(topo: Topology) -> tuple[int, ...]:
    """The sizes one pool's instances can take beside another size: a divisor of a host's GPUs
    (the instance stays in one host), or a multiple of them up to every GPU (whole hosts)."""
    g = topo.gpus_per_host
    small = [t for t in range(1, g + 1) if g % t == 0]
    large = [m * g for m in range(2, topo.hosts + 1) if topo.hosts % m == 0]
    return tuple(small + large)


def _place(tps: list[int], topo: Topology) -> list[int] | None:
    """First GPU of each instance (first fit in order, module docstring); None: too few GPUs."""
    g = topo.gpus_per_host
    at = 0
    first: list[int] = []
    for t in tps:
        if t <= g:
            if at % g + t > g:
                at = (at // g + 1) * g
        elif at % g:
            at = (at // g + 1) * g
        first.append(at)
        at += t
    return first if at <= topo.gpus else None


def _pool_tp(value: int | None, tp: int, key: str, topo: Topology) -> int:
    if value is None:
        return tp
    choices = pool_tp_choices(topo)
    if value != tp and value not in choices:
        raise InputError(
            f"{key} = {value} does not fit hosts of {topo.gpus_per_host} GPU(s) x {topo.hosts} "
            f"(choices: {', '.join(map(str, choices))})",
            option=key,
        )
    return value


def plan_layout(topo: Topology, serving: ServingPolicy, hardware_name: str = "") -> Layout:
    """The instances ``serving`` runs on ``topo`` (the topology already cut at ``serving.tp``,
    :func:`kvtier.deploy.apply.apply_deployment`); impossible ones raise InputError."""
    from kvtier.policy.model import prefill_count

    tp = topo.tp
    ptp = _pool_tp(serving.prefill_tp, tp, "serving.prefill_tp", topo)
    dtp = _pool_tp(serving.decode_tp, tp, "serving.decode_tp", topo)
    split = bool(serving.prefill_instances) or serving.prefill_share > 0
    if (ptp != tp or dtp != tp) and not split:
        raise InputError(
            f"serving.prefill_tp / serving.decode_tp ({ptp} / {dtp}) differ from serving.tp "
            f"({tp}) but the policy has no prefill/decode split; set serving.prefill_instances "
            "or serving.prefill_share, or leave them unset",
            option="serving.prefill_tp",
        )
    most = topo.max_instances
    n = serving.instances if serving.instances is not None else most
    if ptp == dtp == tp:  # one size for every instance: consecutive GPUs, as always
        if serving.tp is not None:
            n = min(n, most)  # serving.tp set: instances follow the GPUs
        if n > most:
            raise InputError(
                f"policy asks for {n} instances but hardware {hardware_name!r} has only "
                f"{most} (tp={tp})"
            )
        n_pf = prefill_count(serving, n)
        return Layout(n, n_pf, tp, tp, tuple(k * tp for k in range(n)), topo.gpus_per_host)
    # two sizes: the most instances up to the count asked for whose split fits the GPUs
    cap = n if serving.instances is not None else topo.gpus // min(ptp, dtp)
    for m in range(cap, 0, -1):
        n_pf = prefill_count(serving, m)
        if n_pf == 0:  # a share of one instance: no split left, aggregated, of serving.tp
            if m * tp <= topo.gpus:
                return Layout(m, 0, tp, tp, tuple(k * tp for k in range(m)), topo.gpus_per_host)
            continue
        if not 1 <= n_pf < m:
            continue
        first = _place([ptp] * n_pf + [dtp] * (m - n_pf), topo)
        if first is not None:
            return Layout(m, n_pf, ptp, dtp, tuple(first), topo.gpus_per_host)
    raise InputError(
        f"no prefill/decode split of prefill_tp={ptp} and decode_tp={dtp} fits the "
        f"{topo.gpus} GPU(s) of {hardware_name!r} (serving.prefill_instances = "
        f"{serving.prefill_instances}, serving.prefill_share = {serving.prefill_share})",
        option="serving.prefill_tp",
    )
