"""The revision of kvtier's model that judged a study's trials.

A trial's metrics and verdict are the simulator's: its engines, cache policies, hardware and
model profiles, policy registries and trace handling. A study continued after any of those
changed would mix verdicts made under two models (and the sampler would learn from both), so
the study records the revision it ran under and a later run under another one is refused
(:func:`kvtier.search.study.check_study_setup`). The revision is a digest of those source and
profile files and of the measured step-time package's version: any edit to them, even one that
changes no figure, starts a new revision, which errs on the side of a fresh study.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
# what decides a replay's figures (relative to the package root)
MODEL_PARTS = ("sim", "cache", "hardware", "policy", "trace", "tier_kinds.py")
SUFFIXES = (".py", ".toml", ".json", ".csv", ".yaml")
STEP_TIME_PACKAGE = "aiconfigurator-core"


@cache
def model_revision() -> str:
    """A short digest of the model's files and the step-time package's version."""
    h = hashlib.sha256()
    for part in MODEL_PARTS:
        root = PACKAGE / part
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in files:
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                h.update(path.relative_to(PACKAGE).as_posix().encode())
                h.update(b"\0")
                h.update(path.read_bytes())
                h.update(b"\0")
    try:
        h.update(metadata.version(STEP_TIME_PACKAGE).encode())
    except metadata.PackageNotFoundError:
        h.update(b"-")
    return h.hexdigest()[:16]
