"""The property tier's settings: one hypothesis profile for CI (derandomized, so a failure in CI is the
same failure on a laptop), small enough to fit the tier's share of CI's time."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# derandomize: the examples are a function of the test alone (no database, no seed), so CI and a developer
# see the same values. max_examples is per field and per base document; the curated hostile values of
# tests/property/strategies.py come on top as explicit examples.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=int(os.environ.get("PDSERVE_PROPERTY_EXAMPLES", "4")),
    deadline=None,
    # Rendering a deployment through the CLI takes milliseconds, not microseconds; long generated values
    # (up to MAX_ARG_STRLEN) are the point.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
    print_blob=False,
)
# A longer local exploration: HYPOTHESIS_PROFILE=explore PDSERVE_PROPERTY_EXAMPLES=200 pytest tests/property
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items):
    # `-m "not property"` leaves the tier out of a quick local run; CI runs it.
    for item in items:
        if "tests/property/" in str(item.fspath):
            item.add_marker("property")
