"""The router's version (the worker versions are read from /server_info in checks.servers)."""

from __future__ import annotations

from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed


def check_router_version(exp: Expectations, version: str, source: str) -> CheckResult:
    cid = "versions.router"
    expected = f"sglang-router {exp.router_version} (pdserve.schema.pins)"
    observed = f"sglang-router {version} ({source})"
    if version != exp.router_version:
        return failed(cid, observed, expected,
                      f"install sglang-router=={exp.router_version} in the router's Python and restart "
                      f"{exp.router_unit}; newer routers (smg) take different flags")
    return passed(cid, observed, expected)
