"""What a study records of the run that searched it, so it can be continued and replayed.

An optimize run stores its setup (trace, profiles, SLO, load, space, prices) and the trace's
sha256 in the study's user attributes (:class:`StudySetup`); a rerun, ``kvtier report`` and
its what-if read them back, and :func:`check_study_trace` is the one check that a trace is
the one the study ran on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import InputError
from kvtier.policy.model import SLO, SLO_TERMS, Policy
from kvtier.scenario import Scenario

SETUP_ATTR = "setup"  # the study's user attributes: what the latest run searched ...
SHA256_ATTR = "trace_sha256"  # ... and the trace it ran on


def slo_to_dict(slo: SLO) -> dict[str, float]:
    """The SLO's set terms, as a study and a policy file record them."""
    return {t: getattr(slo, t) for t in SLO_TERMS if getattr(slo, t) is not None}


def slo_from_dict(data: Mapping[str, Any]) -> SLO:
    return SLO(**{k: float(v) for k, v in data.items()})


def check_study_trace(study: Any, digest: str, *, mismatch: str, option: str) -> None:
    """Raise unless ``study`` ran on the trace whose sha256 is ``digest`` (or records none).

    ``mismatch`` is the message, with ``{sha}`` standing for the recorded digest (shortened):
    resuming a study on another trace and pointing the what-if at a moved trace say it in
    their own words.
    """
    recorded = study.user_attrs.get(SHA256_ATTR)
    if recorded is not None and recorded != digest:
        raise InputError(mismatch.replace("{sha}", f"{recorded[:12]}..."), option=option)


@dataclass(frozen=True)
class StudySetup:
    """What an optimize run searched, recorded with its study so it can be replayed later."""

    trace: str
    trace_sha256: str | None
    hardware: str
    model: str
    slo: SLO
    load: str = "trace"
    rate_scale: float = 1.0
    space: str = ""
    # the price figures every trial was costed at (kvtier.hardware.prices.price_figures);
    # None for a study recorded before they were kept
    prices: dict[str, Any] | None = None
    # what the study minimises (kvtier.search.objective.OBJECTIVES); recorded unless "cost"
    objective: str = "cost"
    # the model revision its trials were judged under (kvtier.search.revision); None for a
    # study recorded before it was kept
    model_revision: str | None = None

    def to_attrs(self) -> dict[str, Any]:
        """The study user attributes this setup is stored as."""
        setup = {
            "trace": self.trace,
            "hardware": self.hardware,
            "model": self.model,
            "slo": slo_to_dict(self.slo),
            "load": self.load,
            "rate_scale": self.rate_scale,
            "space": self.space,
        }
        if self.prices is not None:
            setup["prices"] = self.prices
        if self.objective != "cost":
            setup["objective"] = self.objective
        if self.model_revision is not None:
            setup["model_revision"] = self.model_revision
        return {SHA256_ATTR: self.trace_sha256, SETUP_ATTR: setup}

    def record(self, study: Any) -> None:
        for key, value in self.to_attrs().items():
            study.set_user_attr(key, value)

    @classmethod
    def from_study(cls, study: Any) -> StudySetup:
        """The setup ``study`` recorded; an :class:`InputError` when it records none."""
        setup = dict(study.user_attrs.get(SETUP_ATTR) or {})
        if not setup:
            raise InputError(
                f"study {study.study_name!r} records no setup to replay", option="--study"
            )
        return cls(
            trace=str(setup.get("trace", "")),
            trace_sha256=study.user_attrs.get(SHA256_ATTR),
            hardware=str(setup.get("hardware")),
            model=str(setup.get("model")),
            slo=slo_from_dict(setup.get("slo") or {}),
            load=str(setup.get("load", "trace")),
            rate_scale=float(setup.get("rate_scale", 1.0)),
            space=str(setup.get("space", "")),
            prices=setup.get("prices"),
            objective=str(setup.get("objective", "cost")),
            model_revision=setup.get("model_revision"),
        )

    def scenario(self, policy: Policy, *, trace_path: str | None = None) -> Scenario:
        """The scenario the study evaluated its trials in, with ``policy`` as the base.

        ``trace_path`` replaces the recorded path of a trace that has moved; it must hold the
        same trace (:func:`check_study_trace` first).
        """
        from kvtier.hardware import load_hardware, load_model
        from kvtier.hardware.prices import with_price_figures
        from kvtier.trace.io import read_trace

        hardware = load_hardware(self.hardware)
        if self.prices is not None:
            hardware = with_price_figures(hardware, self.prices)
        return Scenario(
            read_trace(trace_path or self.trace),
            hardware,
            load_model(self.model),
            policy,
            slo=self.slo,
            load=self.load,
            rate_scale=self.rate_scale,
        )


def trace_sha256(path: str | Path, *, unreadable: str, option: str) -> str:
    """The sha256 of a trace file; ``unreadable`` is the message when it cannot be read."""
    from kvtier.policy.file import sha256_of

    try:
        return sha256_of(path)
    except OSError:
        raise InputError(unreadable, option=option) from None
