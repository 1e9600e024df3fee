"""The real edge of a cutover: systemctl, the smoke test through the public port, NVML, the clock."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pdserve.cutover.boot_links import UnitFiles
from pdserve.cutover.edge import Check, GpuProcess, GpuUnknown
from pdserve.cutover.plan import Plan
from pdserve.probes import chat
from pdserve.probes.cgroups import unit_of
from pdserve.probes.credentials import CredentialError, read_key
from pdserve.probes.paths import path_facts
from pdserve.probes.systemctl import Systemctl, UnitState
from pdserve.schema.boot import Layout
from pdserve.schema.config import Deployment
from pdserve.schema.derived import API_KEY_CREDENTIAL

SMOKE_TIMEOUT_SEC = 60.0


def nvml_gpu_processes(gpus: Sequence[int]) -> list[GpuProcess]:
    """The compute processes on `gpus` and the unit each belongs to (NVML, then the cgroup)."""
    from pdserve.probes.nvml import read_gpus
    from pdserve.probes.observations import Unavailable

    try:
        seen = {gpu.index: gpu for gpu in read_gpus()}
    except Unavailable as exc:
        raise GpuUnknown(str(exc)) from None
    missing = [gpu for gpu in gpus if gpu not in seen]
    if missing:
        raise GpuUnknown(f"GPU(s) {missing} do not exist (NVML sees {len(seen)})")
    return [GpuProcess(gpu, pid, unit_of(pid)) for gpu in gpus for pid in seen[gpu].pids]


# Where `systemctl enable` and `add-wants` write their links (systemd.unit(5): the system's config dir).
UNIT_CONFIG_DIR = "/etc/systemd/system"


def unit_files(local: bool, states: dict[str, UnitState]) -> UnitFiles:
    """The filesystem's side of the boot links, or nothing when systemctl acts on another host."""
    if not local:
        return UnitFiles()
    fragments = {name: facts for name, state in states.items()
                 if state.fragment_path.startswith("/") and (facts := path_facts(state.fragment_path)) is not None}
    return UnitFiles(path_facts(UNIT_CONFIG_DIR), fragments)


def read_api_key(dep: Deployment) -> tuple[str | None, str | None]:
    """(key, problem): the router's key when one is configured (its systemd credential, else its file)."""
    path = dep.router.api_key_file
    if path is None:
        return None, None
    try:
        return read_key(path, API_KEY_CREDENTIAL, "router.api_key_file"), None
    except CredentialError as exc:
        return None, f"{exc} (run the cutover as root)" if exc.unreadable else str(exc)


def smoke_chat(dep: Deployment, url: str, timeout: float = SMOKE_TIMEOUT_SEC) -> Check:
    """One short chat completion through `url` with the official client: the smallest end-to-end proof."""
    key, problem = read_api_key(dep)
    if problem:
        return Check(False, problem)
    client = chat.client(url, key, timeout)
    began = time.monotonic()
    try:
        answer = chat.ready(client, dep.model.served_name or dep.model.path)
    finally:
        client.close()
    took = time.monotonic() - began
    if answer.error:
        return Check(False, f"chat completion through {url} failed: {answer.error}")
    if answer.unexpected:
        return Check(False, f"chat completion through {url}: unexpected answer: {answer.unexpected}")
    text = answer.content or answer.reasoning_content or ""
    if not text:
        return Check(False, f"chat completion through {url} returned no text ({took:.2f} s)")
    return Check(True, f"chat completion through {url}: {text.strip()[:40]!r} in {took:.2f} s")


# The smoke subset of `pdserve verify` run through the router after a cutover to PD: the router sees
# both workers, lists exactly the configured ones, and answers a chat through the official client.
PD_SMOKE_CHECKS = ("router.readiness", "router.workers", "e2e.chat")


def smoke_verify(dep: Deployment, checks: Sequence[str] = PD_SMOKE_CHECKS,
                 probe_timeout: float = 10.0, chat_timeout: float = SMOKE_TIMEOUT_SEC, here: str = "") -> Check:
    """Run a subset of the verifier's checks (from host `here` of a multi-host deployment); pass when none
    fails (a skip names its reason)."""
    from pdserve.probes import http
    from pdserve.verify.expect import expectations
    from pdserve.verify.hosts import checks_for
    from pdserve.verify.result import Status
    from pdserve.verify.runner import Context, Options, run, select

    exp = expectations(dep, here=here)
    registry = checks_for(exp)
    plan = select(list(registry), list(checks), [])
    options = Options(probe_timeout=probe_timeout, chat_timeout=chat_timeout)
    with http.client(probe_timeout) as client:
        results, errors = run(Context(dep, exp, options, client, here=here), plan, checks=registry)
    chosen = [r for r in results if plan[r.id] is None]
    bad = [r for r in chosen if r.status is Status.FAIL]
    summary = "; ".join(f"{r.id} {r.status}: {r.observed}" for r in chosen)
    if bad or errors:
        fixes = "; ".join(f"{r.id}: {r.remediation}" for r in bad if r.remediation)
        return Check(False, f"pdserve verify --only {','.join(checks)}: {summary}"
                     + (f"; fix: {fixes}" if fixes else "")
                     + (f"; verifier errors: {'; '.join(errors)}" if errors else ""))
    return Check(True, f"pdserve verify --only {','.join(checks)}: {summary}")


class HostEdge:
    """What `Cutover` needs from this host, for one deployment."""

    def __init__(self, dep: Deployment, plan: Plan, systemctl: Systemctl | None = None, local: bool = True):
        self.dep = dep
        self.plan = plan
        self.systemctl = systemctl or Systemctl()
        self.local = local  # systemctl acts on the files this process sees (not through a wrapper)

    def show(self, units: Sequence[str]) -> dict[str, UnitState]:
        return self.systemctl.show(units)

    def start(self, units: Sequence[str]) -> None:
        self.systemctl.start(units)

    def stop(self, units: Sequence[str], timeout: float) -> None:
        self.systemctl.stop(units, timeout)

    def add_wants(self, target: str, units: Sequence[str]) -> None:
        self.systemctl.add_wants(target, units)

    def disable(self, units: Sequence[str]) -> None:
        self.systemctl.disable(units)

    def reset_failed(self, units: Sequence[str]) -> None:
        self.systemctl.reset_failed(units)

    def unit_files(self, states: dict[str, UnitState]) -> UnitFiles:
        return unit_files(self.local, states)

    def smoke(self, layout: Layout) -> Check:
        if layout == "pd" and self.plan.host:
            return smoke_verify(self.dep, self.plan.smoke_checks, here=self.plan.host)
        if layout == "pd":
            return smoke_verify(self.dep)
        # The verifier's checks describe the PD layout; the fallback gets one chat through its own address.
        return smoke_chat(self.dep, self.plan.public_url[layout])

    def gpu_processes(self, gpus: Sequence[int]) -> list[GpuProcess]:
        return nvml_gpu_processes(gpus)

    def clock(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
