"""kvtier: a trace-driven optimizer for KV-cache tiering in LLM inference.

The package follows the data flow of the design: ``trace`` (files to ``Trace`` and
``BlockedTrace``), ``hardware`` (profiles), ``sim`` (the tier model), ``search`` (Optuna),
``policy`` (policy files and exporters) and ``report`` (tables and plots).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
