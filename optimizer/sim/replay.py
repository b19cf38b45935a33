"""One replay from files: what ``kvtier replay`` runs, also used by scripts.

Resolves the profile names (explicit argument, else the policy file's, else the defaults
``h100-node`` and ``Llama-3.1-8B``), maps the trace to the policy's block size, compresses time
by ``rate_scale`` and simulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import Policy, load_policy
from kvtier.sim import simulate
from kvtier.sim.metrics import Metrics
from kvtier.trace.blocked import BlockedTrace

DEFAULT_HARDWARE = "h100-node"
DEFAULT_MODEL = "Llama-3.1-8B"


@dataclass(frozen=True)
class ReplaySetup:
    """Everything resolved for one replay."""

    trace: BlockedTrace
    hardware: Hardware
    model: ModelProfile
    policy: Policy


def scale_arrivals(trace: BlockedTrace, rate_scale: float) -> BlockedTrace:
    """The same requests arriving ``rate_scale`` times as fast (``arrival_s / rate_scale``)."""
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise InputError(f"--rate-scale must be a positive number, got {rate_scale}")
    if rate_scale == 1.0:
        return trace
    return trace.with_arrivals(trace.arrival_s / rate_scale)


def prepare(
    trace_path: str,
    *,
    hardware: str | None = None,
    model: str | None = None,
    policy_path: str | None = None,
    preset: str | None = None,
    block_tokens: int | None = None,
    rate_scale: float = 1.0,
) -> ReplaySetup:
    """Load and map everything a replay needs; bad input raises :class:`InputError`."""
    from kvtier.policy.presets import load_preset
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.io import read_trace

    if policy_path:
        policy = load_policy(policy_path)
    elif preset:
        policy = load_preset(preset)
    else:
        policy = Policy()
    if block_tokens is not None:
        if block_tokens < 1:
            raise InputError(f"--block-tokens must be >= 1, got {block_tokens}")
        policy = policy.with_block_tokens(block_tokens)
    hw = load_hardware(hardware or policy.hardware or DEFAULT_HARDWARE)
    mdl = load_model(model or policy.model or DEFAULT_MODEL)
    blocked = block_trace(
        read_trace(trace_path),
        policy.block_tokens,
        share_across_tenants=policy.share_across_tenants,
    )
    return ReplaySetup(scale_arrivals(blocked, rate_scale), hw, mdl, policy)


def replay(setup: ReplaySetup, *, engine: str = "numba") -> Metrics:
    return simulate(setup.trace, setup.hardware, setup.model, setup.policy, engine=engine)
