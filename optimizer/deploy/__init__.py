"""Placing a policy on hardware: which GPUs each instance takes, at which tensor parallelism and
weight type. The simulator (:mod:`kvtier.sim.config`) and the exporters (:mod:`kvtier.export`)
both start from here, so a replay and a launch script deploy the same thing."""

from __future__ import annotations

from kvtier.deploy.apply import apply_deployment
from kvtier.deploy.layout import Layout, plan_layout, pool_tp_choices

__all__ = ["Layout", "apply_deployment", "plan_layout", "pool_tp_choices"]
