"""Where the built-in policy files are: presets, validation scenarios and search spaces.

They live in the checkout's ``policies/`` directory, the layout users edit and read. A wheel
carries a copy to ``<prefix>/share/kvtier/policies`` (``[tool.setuptools.data-files]`` in
``pyproject.toml``), so an installed kvtier finds them without a source checkout.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

CHECKOUT_POLICIES = Path(__file__).resolve().parents[1] / "policies"


def policies_dir() -> Path:
    """The directory of the built-in ``presets/`` and ``spaces/``.

    The source checkout's ``policies/`` wins (an editable install, or running from the tree);
    otherwise the installed copy under the environment's data prefix.
    """
    if (CHECKOUT_POLICIES / "presets").is_dir():
        return CHECKOUT_POLICIES
    for prefix in (sysconfig.get_path("data"), sys.prefix):
        candidate = Path(prefix) / "share" / "kvtier" / "policies"
        if (candidate / "presets").is_dir():
            return candidate
    return CHECKOUT_POLICIES  # absent: callers report unknown names with an empty list
