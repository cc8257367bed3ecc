"""Shared pytest configuration: hypothesis profiles, no GUI backend."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", max_examples=25, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture])
    settings.register_profile("long", max_examples=2000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is a test extra
    pass
