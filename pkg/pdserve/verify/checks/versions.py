"""The running versions against the pins: sglang as each worker's /server_info reports it, the router's
as its process has it loaded (pdserve.probes.versions)."""

from __future__ import annotations

from pdserve.probes.answers import Mismatch, Version, fit
from pdserve.probes.observations import HttpObs
from pdserve.schema.pins import ROUTER_DISTRIBUTION
from pdserve.verify.expect import Expectations, WorkerExpectation
from pdserve.verify.result import CheckResult, failed, passed, skipped


def _against_pin(cid: str, package: str, found: object, pinned: str, source: str, fix: str) -> CheckResult:
    expected = f"{package} {pinned} (pdserve.schema.pins)"
    observed = f"{package} {found}" + (f" ({source})" if source else "")
    if found != pinned:
        return failed(cid, observed, expected, fix)
    return passed(cid, observed, expected)


def check_version(exp: Expectations, w: WorkerExpectation, info: HttpObs) -> CheckResult:
    cid = f"versions.{w.id}"
    if not info.ok or not isinstance(info.body, dict):
        return skipped(cid, f"no /server_info from the {w.role} server ({info.describe()})",
                       f"sglang {exp.sglang_version} (pdserve.schema.pins)")
    version = fit(Version, info.body, f"{w.url}/server_info")
    if isinstance(version, Mismatch):
        return failed(cid, version.observed, f"sglang {exp.sglang_version}; {version.expected}",
                      f"the answer on the {w.role} port is not SGLang's: `systemctl cat {w.unit}` and `ss -ltnp` "
                      "name what listens there")
    return _against_pin(cid, "sglang", version.version, exp.sglang_version, "",
                        f"install sglang=={exp.sglang_version} in the units' Python (or update pdserve.schema.pins "
                        f"after re-checking the facts it depends on), then restart {w.unit}")


def check_router_version(exp: Expectations, version: str, source: str) -> CheckResult:
    return _against_pin("versions.router", ROUTER_DISTRIBUTION, version, exp.router_version, source,
                        f"install {ROUTER_DISTRIBUTION}=={exp.router_version} in the router's Python and restart "
                        f"{exp.router_unit}; other versions take other flags and answer differently")
