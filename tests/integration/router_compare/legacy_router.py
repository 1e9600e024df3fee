"""sglang-router 0.3.2 in front of the same workers: the router argv pdserve rendered for it before the move
to smg (commit 65ec5b4^, pkg/pdserve/render/argv.py: router_args and resilience_args, with RouterSpec's
defaults of then), and the drop-in that puts that argv in place of the rendered router unit's ExecStart=.
Pure: the deployment and the rendered ExecStart= in, text out.
"""

from __future__ import annotations

import shlex
import textwrap

from pdserve.render.argv import ROUTER_MODULE
from pdserve.render.units import command_line, render_ini
from pdserve.schema.config import Deployment
from pdserve.schema.derived import router_shutdown_grace
from pdserve.schema.topology import servers

LEGACY_MODULE = "sglang_router.launch_router"
LEGACY_VERSION = "0.3.2"
DROPIN_NAME = "50-sglang-router-0.3.2.conf"

# RouterSpec's defaults before the move (65ec5b4^, pkg/pdserve/schema/config.py), chosen then for 0.3.2 with
# one worker per role: hold a request through a worker's restart (30 attempts, pauses up to 2 s: about 45 s)
# instead of failing it, take a restarted worker back within one 2 s probe, and no breaker (its 60 s open
# state turned a 5 s outage into a minute of 503s). The README's 0.3.2 fault table was measured with them.
LEGACY_RETRY_MAX_RETRIES = 30
LEGACY_RETRY_MAX_BACKOFF_MS = 2000
LEGACY_HEALTH_CHECK_INTERVAL_SECS = 2
LEGACY_HEALTH_SUCCESS_THRESHOLD = 1

# Flags pdserve renders for smg that 0.3.2's parser refuses ("unrecognized arguments"), and why each is
# not carried over (tests/unit/test_router_compare.py holds this against 0.3.2's real parser).
REFUSED_BY_LEGACY = {
    "--health-check-port": "probes on their own runtime are smg's (1.x); 0.3.2 answers /readiness on its main port",
    "--upstream-pool-idle-timeout-secs": "smg's fix for stale pooled connections (smg#2162); 0.3.2 has no such knob",
    "--prefill-max-inflight-requests-per-worker": "prefill admission is smg's (1.13.0); 0.3.2 has none",
    "--prefill-queue-size": "prefill admission is smg's (1.13.0); 0.3.2 has none",
    "--prefill-queue-timeout-secs": "prefill admission is smg's (1.13.0); 0.3.2 has none",
}


class LegacyUnsupported(ValueError):
    """The deployment needs something the 0.3.2 drop-in cannot give it; the text names field and fix."""


def legacy_router_args(dep: Deployment) -> list[str]:
    """The router's flags as pdserve rendered them for sglang-router 0.3.2 (65ec5b4^): the deployment's
    servers, addresses, policies and timeouts, the resilience settings of then."""
    router = dep.router
    args = ["--pd-disaggregation"]
    for server in servers(dep):
        args += [f"--{server.role}", server.url]
        args += [str(server.bootstrap_port)] if server.bootstrap_port is not None else []
    args += ["--host", router.host, "--port", str(router.port),
             "--prometheus-host", router.prometheus_host, "--prometheus-port", str(router.prometheus_port)]
    for flag, policy in (("--policy", router.policy), ("--prefill-policy", router.prefill_policy),
                         ("--decode-policy", router.decode_policy)):
        if policy:
            args += [flag, policy]
    args += ["--health-check-timeout-secs", str(router.health_check_timeout_secs),
             "--worker-startup-timeout-secs", str(router.worker_startup_timeout_secs),
             "--request-timeout-secs", str(router.request_timeout_secs),
             "--disable-circuit-breaker",
             "--retry-max-retries", str(LEGACY_RETRY_MAX_RETRIES),
             "--retry-max-backoff-ms", str(LEGACY_RETRY_MAX_BACKOFF_MS),
             "--health-check-interval-secs", str(LEGACY_HEALTH_CHECK_INTERVAL_SECS),
             "--health-success-threshold", str(LEGACY_HEALTH_SUCCESS_THRESHOLD),
             "--shutdown-grace-period-secs", str(router_shutdown_grace(dep))]
    return args + list(router.extra_args)


def legacy_exec_start(rendered: list[str], dep: Deployment) -> list[str]:
    """The rendered router ExecStart= argv with smg's module and flags replaced by 0.3.2's: the same Python
    (and whatever precedes it), `-m sglang_router.launch_router` and legacy_router_args."""
    if dep.router.api_key_file is not None:
        # The keyed launcher (pdserve.launch.keyed_launch) imports smg's launch_router now.
        raise LegacyUnsupported(f"router.api_key_file = {str(dep.router.api_key_file)!r}: the keyed launcher starts "
                                "smg only; compare the routers on a deployment without an API key")
    at = [i for i in range(len(rendered) - 1) if rendered[i:i + 2] == ["-m", ROUTER_MODULE]]
    if len(at) != 1:
        raise LegacyUnsupported(f"the rendered router ExecStart= {rendered!r} does not run `-m {ROUTER_MODULE}` "
                                "once; nothing to replace")
    return [*rendered[:at[0]], "-m", LEGACY_MODULE, *legacy_router_args(dep)]


def dropped_flags(rendered: list[str]) -> list[str]:
    """The refused flags the rendered smg argv holds (said in the drop-in)."""
    return [flag for flag in REFUSED_BY_LEGACY if flag in rendered]


def legacy_dropin(rendered: list[str], dep: Deployment) -> str:
    """The drop-in (<router unit>.d/DROPIN_NAME) that runs 0.3.2 instead of smg, written through the units'
    own emitter (render_ini, command_line): a value it cannot carry stops the benchmark."""
    dropped = dropped_flags(rendered)
    why = (f"Router comparison benchmark (tests/integration/router_compare): sglang-router {LEGACY_VERSION} in place "
           "of smg, with the router argv pdserve rendered for it before the move to smg (65ec5b4^): breaker off, "
           f"{LEGACY_RETRY_MAX_RETRIES} attempts with pauses up to {LEGACY_RETRY_MAX_BACKOFF_MS} ms, health checks "
           f"every {LEGACY_HEALTH_CHECK_INTERVAL_SECS} s, one success takes a worker back. smg's health failure "
           "threshold, backoff shape and breaker settings are left at 0.3.2's defaults as then. ")
    if dropped:
        why += "Dropped, since 0.3.2 refuses them: " + "; ".join(f"{f} ({REFUSED_BY_LEGACY[f]})" for f in dropped) + "."
    else:
        why += ("Not rendered here, and 0.3.2 would refuse them: " + ", ".join(REFUSED_BY_LEGACY) + ".")
    header = "\n".join(textwrap.wrap(why, width=100))
    # An empty ExecStart= first: a drop-in's ExecStart= adds to the list otherwise, which a Type=exec unit refuses.
    entries = [("ExecStart", ""), ("ExecStart", command_line(legacy_exec_start(rendered, dep)))]
    return render_ini([("Service", entries)], header)


def exec_start_of(unit_text: str) -> list[str]:
    """The argv of the last non-empty ExecStart= of a unit or drop-in that pdserve wrote (no specifiers or
    variables there: exec_line marks a line holding `$` with a leading `:`, which is taken off)."""
    values = [line.removeprefix("ExecStart=") for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    values = [v for v in values if v]
    if not values:
        raise ValueError("no ExecStart= with a command line")
    return shlex.split(values[-1].removeprefix(":"))
