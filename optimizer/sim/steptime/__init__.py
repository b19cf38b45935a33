"""Step-time backends: the roofline and tables of measured operator times.

A replay's step time is one packed float64 array (layout: :mod:`kvtier.sim.timing`) that both
simulators read. :func:`roofline_params` packs the roofline; :func:`measured_tables` builds (or
reads from the disk cache) the measured tables from NVIDIA's aiconfigurator-core operator
database, and :func:`pack_measured` appends them. Nothing here imports numba or
aiconfigurator-core at import time: the CLI's start-up stays light.
"""

from kvtier.sim.steptime.measured import (
    AIC_VERSION_PIN,
    MeasuredKey,
    MeasuredTables,
    measured_key,
    measured_tables,
)
from kvtier.sim.steptime.pack import pack_measured, roofline_params, validate_timing

BACKENDS = ("measured", "roofline", "auto")

__all__ = [
    "AIC_VERSION_PIN",
    "BACKENDS",
    "MeasuredKey",
    "MeasuredTables",
    "measured_key",
    "measured_tables",
    "pack_measured",
    "roofline_params",
    "validate_timing",
]
