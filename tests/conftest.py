"""Test-session settings shared by every test module."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _step_time_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Measured step-time tables are cached in a directory of this session, never the user's
    cache (subprocesses the tests start inherit it)."""
    if "KVTIER_CACHE_DIR" not in os.environ:
        os.environ["KVTIER_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvtier-cache"))
