"""The GPU tier under a real systemd, on the GPU machine: boot the rootfs with the GPU, the host's Python and
the staged SGLang bound in, install the units exactly as `pdserve render` writes them (plus the drop-ins of
dropins.py, each saying why), start them as an operator would, run `pdserve verify` inside, then kill -9 the
prefill's main process under load and watch systemd bring it back.

    python3 -m tests.gpu.systemd.runner run --tree DIR --out DIR       # boot, start, verify, kill under load
    python3 -m tests.gpu.systemd.runner restarts --tree DIR --out DIR  # warm, then cold, restart of the prefill
    python3 -m tests.gpu.systemd.runner bench --tree DIR --out DIR     # pdserve bench --compare single,pd

`run` leaves the container booted (nspawn runs in its own session, so it outlives the device call) and
records where it is in DIR/state.json; `restarts` picks it up there. Every phase writes the report again,
so a call cut short keeps what it measured. Nothing here runs in CI: tests/gpu/systemd/test_*.py test its
pure parts on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tests.gpu.load import ChatLoad, Outcome, PortProber, as_report, succeeding_again, summarize, timeline
from tests.gpu.pd_run import SERVED_NAME, write_api_key, write_deployment
from tests.gpu.systemd import dropins, host, phases, table
from tests.integration.systemd.container import Container, ContainerError, PythonEnv, customize

NAME = "gputest"
SITE_INSIDE = "/opt/pdserve-gpu/site"
CHECKOUT_INSIDE = "/opt/pdserve-gpu/checkout"
MODEL_INSIDE = "/var/lib/pdserve-gpu/tiny-llama"
KEY_INSIDE = "/etc/pdserve/router.key"
DEPLOYMENT_INSIDE = "/etc/pdserve/gputest.toml"
CONFIG_INSIDE = f"/etc/systemd/system/pdserve-{NAME}.json"
PDSERVE_INSIDE = "/usr/local/bin/pdserve"
UNITS = {role: f"sglang-{NAME}-{role}.service" for role in ("prefill", "decode", "router")}
FALLBACK_UNIT = f"sglang-{NAME}.service"  # the single-server fallback, which `bench --compare` cuts over to
# The machine's policy: NVLink multicast stays off, also in programs started with their own environment.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# The second router of the side-by-side column: sglang-router 0.3.2, a plain process, with the resilience
# flags pdserve rendered for it before smg (README, "Prefill kill -9 under load"), no key (the workers take none).
LEGACY_ROUTER_FLAGS = ["--health-check-timeout-secs", "30", "--worker-startup-timeout-secs", "600",
                       "--request-timeout-secs", "1800", "--disable-circuit-breaker", "--retry-max-retries", "30",
                       "--retry-max-backoff-ms", "2000", "--health-check-interval-secs", "2",
                       "--health-success-threshold", "1"]


class Report:
    def __init__(self, out: Path, name: str):
        self.path = out / f"{name}.json"
        self.data: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "commit": os.environ.get("PDSERVE_COMMIT", "unknown")}
        if self.path.exists():
            self.data = json.loads(self.path.read_text())

    def __setitem__(self, key, value) -> None:
        self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")

    def __getitem__(self, key):
        return self.data[key]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the container ---------------------------------------------------------------------------------------

def python_env(facts: host.HostFacts, read_only: list[str]) -> PythonEnv:
    layout = facts.python
    return PythonEnv(python=str(Path(layout.prefix) / "bin" / "python3"), prefix=layout.prefix,
                     base_prefix=layout.base_prefix, binds=tuple(b for b in read_only if ":" not in b),
                     rootfs_packages=())


def prepare_system(root: Path, facts: host.HostFacts, env: PythonEnv) -> None:
    """The rootfs made ready for GPU units: the service user, the driver's libraries on the loader's path."""
    customize(root, env, "pdserve")
    (root / host.DRIVER_CONF).write_text(host.loader_conf(facts))
    shim_dir = root / host.HOST_LIBS
    shim_dir.mkdir(parents=True, exist_ok=True)
    (root / host.HOST_LIBS_CONF).write_text(f"/{host.HOST_LIBS}\n")
    for directory in facts.driver_dirs:
        if (Path(directory) / "libcuda.so.1").exists() and not (shim_dir / "libcuda.so").is_symlink():
            (shim_dir / "libcuda.so").symlink_to(Path(directory) / "libcuda.so.1")
            (shim_dir / "libcuda.so.1").symlink_to(Path(directory) / "libcuda.so.1")


def prepare_deployment(root: Path, facts: host.HostFacts, ports: dict[str, int]) -> None:
    """pdserve, the model, the router's key and the deployment file, where the units look for them."""
    python = str(Path(facts.python.prefix) / "bin" / "python3")
    shim = root / PDSERVE_INSIDE.lstrip("/")
    shim.write_text(f"#!{python}\nimport sys\nsys.path[:0] = [{CHECKOUT_INSIDE + '/pkg'!r}, {SITE_INSIDE!r}]\n"
                    "from pdserve.cli.main import main\nmain()\n")
    shim.chmod(0o755)
    from tests.gpu.tiny_model import make_tiny_model

    model = root / MODEL_INSIDE.lstrip("/")
    make_tiny_model(model)
    subprocess.run(["chmod", "-R", "a+rX", str(root / "var/lib/pdserve-gpu")], check=True, timeout=30)
    etc = root / "etc/pdserve"
    etc.mkdir(parents=True, exist_ok=True)
    write_api_key(etc).rename(root / KEY_INSIDE.lstrip("/"))
    numa = 0 if Path("/sys/devices/system/node/node0").is_dir() and shutil.which("numactl") else None
    written = write_deployment(etc, Path(MODEL_INSIDE), ports, numa_node=numa, gpus=1,
                               api_key_file=Path(KEY_INSIDE),
                               environment=NO_MULTICAST)
    written.rename(root / DEPLOYMENT_INSIDE.lstrip("/"))


def end_previous(work: Path) -> None:
    """A container left by an earlier call of this machine: kill its PID 1 (the whole PID namespace goes)."""
    state = work / "state.json"
    if state.exists():
        old = json.loads(state.read_text())
        for pid in (old["init_pid"], old["nspawn_pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(3)


def stage_checkout(checkout: Path, work: Path) -> Path:
    """A copy of the checkout's code in `work`, for the container to bind. Not the checkout itself: the next
    device call replaces the copied working tree, and a bind of the old one then shows nothing, so `restarts`
    found no pdserve for the units' gates (H200, 2026-12-05: "No module named 'pdserve'")."""
    staged = work / "checkout"
    shutil.rmtree(staged, ignore_errors=True)
    for part in ("pkg", "tests"):
        shutil.copytree(checkout / part, staged / part, symlinks=True)
    return staged


def boot(root: Path, work: Path, report: Report, deployment: bool = True) -> tuple[Container, host.HostFacts]:
    end_previous(work)
    facts = host.discover(site=str(work / "tree/site"), checkout=str(stage_checkout(Path.cwd(), work)))
    read_only, options = host.nspawn_options(facts, SITE_INSIDE, CHECKOUT_INSIDE)
    env = python_env(facts, read_only)
    ports = {"prefill": 30000, "decode": 30002, "router": 30001, "bootstrap": 8998, "prometheus": 29000}
    prepare_system(root, facts, env)
    if deployment:
        prepare_deployment(root, facts, ports)
    report["host"] = {"python": facts.python.__dict__, "devices": facts.devices, "driver_dirs": facts.driver_dirs,
                      "ninja_outside_the_env": facts.ninja, "binds_read_only": read_only, "nspawn_options": options}
    box = Container(root, env, work / "console.log", nspawn=tuple(host.nspawn_command(root)),
                    extra_args=tuple(options), read_only_binds=tuple(b for b in read_only if ":" in b))
    began = time.monotonic()
    box.boot()
    report["boot_s"] = round(time.monotonic() - began, 1)
    report["systemd_version"] = box.run(["systemctl", "--version"]).stdout.splitlines()[0]
    (work / "state.json").write_text(json.dumps({"init_pid": box.pid, "nspawn_pid": box.proc.pid,
                                                 "root": str(root), "ports": ports}))
    return box, facts


def attach(work: Path) -> Container:
    state = json.loads((work / "state.json").read_text())
    box = Container(Path(state["root"]), PythonEnv("", "", "", (), ()), work / "console.log")
    box.pid = state["init_pid"]
    if not Path(f"/proc/{box.pid}").exists():
        raise SystemExit(f"the container's systemd (PID {box.pid}) is gone: run `runner run` again")
    return box


def fill_libraries(box: Container, facts: host.HostFacts, root: Path, report: Report) -> None:
    """ldconfig inside; copy from the host each library the host's Python needs and the rootfs lacks."""
    box.run(["ldconfig"])
    dynload = Path(facts.python.stdlib) / "lib-dynload"
    script = f"ldd {facts.python.executable} {dynload}/*.so 2>/dev/null"
    missing = host.missing_libraries(box.sh(script, check=False).stdout)
    copied = {}
    if missing:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
        for soname in missing:
            for line in cache.splitlines():
                if line.strip().startswith(soname + " ") and "x86-64" in line:
                    source = line.split("=>")[-1].strip()
                    shutil.copy2(source, root / host.HOST_LIBS / soname)
                    copied[soname] = source
                    break
        box.run(["ldconfig"])
    still = host.missing_libraries(box.sh(script, check=False).stdout)
    report["host_libraries"] = {"missing": missing, "copied_from_host": copied, "still_missing": still}


def unit_timestamps(box: Container) -> dict[str, dict]:
    states = box.systemctl.show(list(UNITS.values()))
    return {name: {"active": s.active_state, "sub": s.sub_state, "main_pid": s.main_pid,
                   "exec_main_start_us": s.exec_main_start_us, "active_enter_us": s.active_enter_us,
                   "inactive_exit_us": s.inactive_exit_us} for name, s in states.items()}


def journal(box: Container, unit: str) -> list[phases.Entry]:
    done = box.run(["journalctl", "--no-pager", "-o", "json", "-u", unit], timeout=60, check=False)
    return phases.parse_journal_json(done.stdout)


def unit_journal_text(box: Container, unit: str) -> str:
    return box.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-u", unit], timeout=60,
                   check=False).stdout[-4_000_000:]


def save_journals(box: Container, out: Path, units: dict[str, str] = UNITS) -> None:
    for role, unit in units.items():
        (out / f"journal-{role}.txt").write_text(unit_journal_text(box, unit))


def save_journals_together(box: Container, out: Path, units: dict[str, str], name: str = "journals.txt") -> None:
    """Every unit's journal in one file, each under its own heading: a device call brings back 8 files at most."""
    (out / name).write_text("".join(f"===== {role}: {unit}\n{unit_journal_text(box, unit)}\n"
                                    for role, unit in units.items()))


# -- the run ---------------------------------------------------------------------------------------------

def install_units(box: Container, root: Path, facts: host.HostFacts, out: Path, report: Report) -> None:
    python = str(Path(facts.python.prefix) / "bin" / "python3")
    done = box.run([PDSERVE_INSIDE, "render", "-c", DEPLOYMENT_INSIDE, "--out", "/etc/systemd/system",
                    "--sglang-python", python, "--numactl", "/usr/bin/numactl", "--pdserve", PDSERVE_INSIDE,
                    # The machine runs SGLang 0.5.17 (its torch), not the pins, staged apart: README, H200 machines.
                    "--no-python-check"],
                   timeout=120, check=False)
    report["render"] = {"exit": done.returncode, "stderr": done.stderr[-2000:]}
    if done.returncode != 0:
        raise SystemExit(f"pdserve render failed inside the container: {done.stderr}")
    modes = {node: (os.stat(node).st_mode, os.stat(node).st_gid) for node in facts.devices
             if Path(node).exists() and not Path(node).is_dir()}
    link_dir = next((d for d in facts.driver_dirs if (Path(d) / "libcuda.so").exists()), None)
    needed = dropins.needed(NAME, dropins.MachineFacts(modes, link_dir, f"/{host.HOST_LIBS}", SITE_INSIDE))
    dropins.install(needed, root / "etc/systemd/system")
    report["dropins"] = {d.path: d.text() for d in needed}
    box.run(["systemctl", "daemon-reload"], timeout=60)
    cat = box.run(["systemctl", "cat", *UNITS.values()], timeout=30, check=False).stdout
    (out / "units.txt").write_text(cat)


def start_all(box: Container, report: Report, timeout: float) -> bool:
    """`systemctl start` the router, as an operator does: Wants= pulls both workers in, After= orders them."""
    began = time.monotonic()
    box.run(["systemctl", "start", "--no-block", UNITS["router"]], timeout=30)
    outcome = "timeout"
    while time.monotonic() - began < timeout:
        time.sleep(2)
        if box.run(["systemctl", "is-active", UNITS["router"]], check=False).stdout.strip() == "active":
            outcome = "active"
            break
        dead = main_exited_during_gate(box)
        if dead:
            # systemd keeps running ExecStartPost= after the main process is gone; the gate would wait out
            # its own deadline. Stop here and say so.
            outcome = f"main process of {dead} exited while its readiness gate was still waiting"
            break
    stamps = unit_timestamps(box)
    report["start"] = {"exit": 0 if outcome == "active" else 1, "outcome": outcome, "stderr": "",
                       "took_s": round(time.monotonic() - began, 1), "units": stamps}
    ready = {role: round((stamps[u]["active_enter_us"] - stamps[u]["exec_main_start_us"]) / 1e6, 1)
             for role, u in UNITS.items() if stamps[u]["active"] == "active"}
    report["ready_after_start_s"] = ready
    return outcome == "active"


def main_exited_during_gate(box: Container) -> str | None:
    for role in ("prefill", "decode"):
        unit = UNITS[role]
        done = box.run(["systemctl", "show", "-p", "SubState,ExecMainStartTimestampMonotonic,"
                        "ExecMainExitTimestampMonotonic", unit], check=False)
        props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        started, exited = int(props.get("ExecMainStartTimestampMonotonic") or 0), \
            int(props.get("ExecMainExitTimestampMonotonic") or 0)
        if props.get("SubState") == "start-post" and exited > started > 0:
            return unit
    return None


def verify(box: Container, report: Report) -> None:
    # As an operator runs it: in a shell whose Python finds the staged site, as the units' drop-in gives them.
    done = box.run(["env", f"PYTHONPATH={SITE_INSIDE}", PDSERVE_INSIDE, "verify", "--config", CONFIG_INSIDE,
                    "--json", "--probe-timeout", "20",
                    "--chat-timeout", "120"], timeout=400, check=False)
    try:
        checks = {c["id"]: [c["status"], c["observed"]] for c in json.loads(done.stdout)["checks"]}
    except (ValueError, KeyError):
        checks = {"unreadable": [done.stdout[-2000:], done.stderr[-2000:]]}
    report["verify"] = {"exit": done.returncode, "checks": checks,
                        "failing": sorted(k for k, v in checks.items() if v[0] == "fail")}


def start_legacy_router(work: Path, ports: dict[str, int], out: Path) -> tuple[subprocess.Popen, int]:
    from tests.fixtures.ports import free_ports

    port, metrics = free_ports(2)
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--prefill", f"http://127.0.0.1:{ports['prefill']}", str(ports["bootstrap"]),
            "--decode", f"http://127.0.0.1:{ports['decode']}", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), *LEGACY_ROUTER_FLAGS]
    env = {**os.environ, "PYTHONPATH": f"{work / 'tree/site'}:{os.environ.get('PYTHONPATH', '')}", **NO_MULTICAST}
    logfile = (out / "router-0.3.2.log").open("ab")
    return subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, env=env, start_new_session=True), port


def legacy_ready(proc: subprocess.Popen, port: int, timeout: float = 90) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readiness", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    return False


def failure_timing(outcomes: list[Outcome], killed_at: float) -> dict:
    """What each failed request after the kill waited, and whether its 503 said when to come back."""
    failed = [o for o in outcomes if not o.ok and o.ended >= killed_at]
    waits = sorted(o.ended - o.sent for o in failed)
    status = [o for o in failed if o.cause.startswith("HTTP 5")]
    return {
        "failed_after_kill": len(failed),
        "http_5xx": len(status),
        "with_retry_after": sum(1 for o in status if o.retry_after is not None),
        "retry_after_values": sorted({o.retry_after for o in status if o.retry_after is not None}),
        "answered_within_1s": sum(1 for w in waits if w <= 1.0),
        "wait_s_median": round(waits[len(waits) // 2], 2) if waits else None,
        "wait_s_max": round(waits[-1], 2) if waits else None,
    }


def kill_under_load(box: Container, report: Report, legacy_port: int | None, key: str,
                    before_s: float = 10.0, ready_timeout_s: float = 300.0, tail_s: float = 60.0) -> None:
    """4 chat req/s through each router, kill -9 of the prefill's main process, systemd restarts it."""
    routers = {"smg (unit)": (30001, key)}
    if legacy_port is not None:
        routers["sglang-router 0.3.2 (plain process)"] = (legacy_port, "none")
    loads = {name: ChatLoad(f"http://127.0.0.1:{port}/v1", k, SERVED_NAME, rate=4.0, timeout=120.0,
                            max_duration=before_s + ready_timeout_s + tail_s + 60).start()
             for name, (port, k) in routers.items()}
    probers = {name: PortProber("127.0.0.1", port).start() for name, (port, _) in routers.items()}
    unit = UNITS["prefill"]
    old = unit_timestamps(box)[unit]
    restarted_us = ready_us = None
    try:
        time.sleep(before_s)
        killed_at = time.monotonic()
        box.run(["kill", "-9", str(old["main_pid"])], timeout=10)
        deadline = killed_at + ready_timeout_s
        while time.monotonic() < deadline:
            now = unit_timestamps(box)[unit]
            if now["exec_main_start_us"] > old["exec_main_start_us"] and restarted_us is None:
                restarted_us = now["exec_main_start_us"]
            if restarted_us and now["active"] == "active" and now["active_enter_us"] > restarted_us:
                ready_us = now["active_enter_us"]
                break
            time.sleep(0.5)
        ready_at = None if ready_us is None else ready_us / 1e6
        tail_end = (ready_at or time.monotonic()) + tail_s
        while time.monotonic() < tail_end and ready_at is not None:
            if all(succeeding_again(load.snapshot(), ready_at, 8) for load in loads.values()):
                break
            time.sleep(0.5)
    finally:
        outcomes = {name: load.stop() for name, load in loads.items()}
        for prober in probers.values():
            prober.stop()
    new = unit_timestamps(box)[unit]
    result = {"killed_main_pid": old["main_pid"], "new_main_pid": new["main_pid"],
              "kill_to_restart_s": None if restarted_us is None else round(restarted_us / 1e6 - killed_at, 2),
              "kill_to_gate_ready_s": None if ready_us is None else round(ready_us / 1e6 - killed_at, 2),
              "restart_to_gate_ready_s": None if ready_us is None or restarted_us is None
              else round((ready_us - restarted_us) / 1e6, 2),
              "n_restarts": box.run(["systemctl", "show", "-p", "NRestarts", "--value", unit]).stdout.strip(),
              "routers": {}}
    for name in routers:
        summary = summarize(outcomes[name], killed_at, ready_at, probers[name].samples)
        result["routers"][name] = {**as_report(summary), **failure_timing(outcomes[name], killed_at),
                                   "timeline": timeline(outcomes[name], killed_at)}
    if restarted_us is not None:
        marks = phases.phases(journal(box, unit), restarted_us, ready_us)
        result["restart_phases"] = {**marks, **phases.spans(marks)}
    report["prefill_kill_under_load"] = result


def first_start_phases(box: Container, report: Report) -> None:
    stamps = report["start"]["units"]
    result = {}
    for role in ("prefill", "decode"):
        s = stamps[UNITS[role]]
        marks = phases.phases(journal(box, UNITS[role]), s["exec_main_start_us"], s["active_enter_us"] or None)
        result[role] = {**marks, **phases.spans(marks)}
    report["first_start_phases"] = result


def run(args) -> int:
    out, work = args.out, args.work
    began = time.monotonic()
    # `timeout` ends the run with SIGTERM: leave through `finally`, so the journals are saved.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, "systemd-run")
    root = work / "tree/rootfs"
    box, facts = boot(root, work, report)
    log(f"booted: {report['systemd_version']}")
    try:
        fill_libraries(box, facts, root, report)
        install_units(box, root, facts, out, report)
        log("units installed; starting the router (pulls in prefill, then decode)")
        ok = start_all(box, report, timeout=args.start_timeout)
        log(f"start: {report['start']['exit']} ready after {report['ready_after_start_s']}")
        first_start_phases(box, report)
        if not ok:
            return 1
        if args.no_faults:  # start and verify only: a `bench` call follows on this machine
            verify(box, report)
            log(f"verify exit {report['verify']['exit']}, failing {report['verify']['failing']}")
            return 0
        legacy, legacy_port = start_legacy_router(work, {"prefill": 30000, "decode": 30002, "bootstrap": 8998}, out)
        verify(box, report)
        log(f"verify exit {report['verify']['exit']}, failing {report['verify']['failing']}")
        ready = legacy_ready(legacy, legacy_port)
        report["legacy_router"] = {"ready": ready, "port": legacy_port}
        key = (root / KEY_INSIDE.lstrip("/")).read_text().strip()
        kill_under_load(box, report, legacy_port if ready else None, key)
        log("kill under load done\n" + table.render(report.data))
        legacy.terminate()
        # The kill's restart kept the caches (warm); with time left, a cold one in the same call.
        if args.budget_s - (time.monotonic() - began) > args.cold_restart_needs_s:
            report["cold_restart"] = restart_once(box, report, key, cold=True)
            log(f"cold restart: {report['cold_restart']}")
        return 0
    except Exception:
        report["error"] = traceback.format_exc()
        raise
    finally:
        save_journals(box, out)


SERVICE_ONLY = {"Type", "ExecStart", "ExecStartPre", "ExecStartPost", "Restart", "RestartSec", "TimeoutStartSec",
                "TimeoutStopSec", "KillMode", "KillSignal", "WorkingDirectory", "Environment", "StateDirectory",
                "CacheDirectory", "LoadCredential"}


def sandbox_properties(unit_text: str) -> list[str]:
    """The [Service] settings of a rendered unit that make its sandbox (user, limits, hardening), as
    `systemd-run -p` takes them: what runs the smoke kernel exactly as the unit would run SGLang."""
    section, props = "", []
    for line in unit_text.splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key = line.split("=", 1)[0]
            if key not in SERVICE_ONLY:
                props.append(line)
    return props


def smoke(args) -> int:
    """Boot the rootfs and run smoke_kernel.py in a transient unit with the rendered prefill unit's sandbox."""
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, "systemd-smoke")
    root = work / "tree/rootfs"
    box, facts = boot(root, work, report, deployment=False)
    try:
        fill_libraries(box, facts, root, report)
        python = str(Path(facts.python.prefix) / "bin" / "python3")
        props = sandbox_properties(args.unit_file.read_text())
        argv = ["systemd-run", "--wait", "--pipe", "--quiet", "--unit=pdserve-smoke",
                "-p", "StateDirectory=pdserve-smoke", "-p", "Environment=HOME=/var/lib/pdserve-smoke",
                *[a for p in props for a in ("-p", p)],
                python, f"{CHECKOUT_INSIDE}/tests/gpu/systemd/smoke_kernel.py"]
        done = box.run(argv, timeout=300, check=False)
        report["smoke"] = {"argv": argv, "exit": done.returncode, "stdout": done.stdout[-3000:],
                           "stderr": done.stderr[-6000:]}
        log(f"smoke exit {done.returncode}: {done.stdout.strip()[-300:]} {done.stderr.strip()[-1500:]}")
        return done.returncode
    finally:
        box.shutdown()


def restart_once(box: Container, report: Report, key: str, cold: bool) -> dict:
    """Stop the prefill, wipe its caches for a cold start, start it again; time the phases and the first
    success through the router (4 req/s from the stop on)."""
    unit = UNITS["prefill"]
    load = ChatLoad("http://127.0.0.1:30001/v1", key, SERVED_NAME, rate=4.0, timeout=120.0, max_duration=500).start()
    try:
        box.run(["systemctl", "stop", unit], timeout=150)
        wiped = []
        if cold:
            # CacheDirectory= (XDG_CACHE_HOME) and the JIT caches under HOME (StateDirectory=: ~/.triton etc.).
            script = ("rm -rf /var/cache/pdserve/gputest/* /var/cache/pdserve/gputest/.[!.]* "
                      "/var/lib/pdserve/gputest/.triton /var/lib/pdserve/gputest/.cache; "
                      "ls -A /var/cache/pdserve/gputest /var/lib/pdserve/gputest")
            wiped = box.sh(script, check=False).stdout.split()
        began = time.monotonic()
        done = box.run(["systemctl", "start", unit], timeout=400, check=False)
        if done.returncode != 0:
            # The unit's timestamps would be an earlier start's, and its phases nonsense: say it failed.
            return {"cold": cold, "start_exit": done.returncode, "stderr": done.stderr[-2000:],
                    "left_after_wipe": wiped}
        stamps = unit_timestamps(box)[unit]
        ready_at = stamps["active_enter_us"] / 1e6
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not succeeding_again(load.snapshot(), ready_at, 4):
            time.sleep(0.5)
    finally:
        outcomes = load.stop()
    later = sorted(o.ended for o in outcomes if o.ok and o.sent >= ready_at - 5 and o.ended >= ready_at)
    marks = phases.phases(journal(box, unit), stamps["exec_main_start_us"], stamps["active_enter_us"])
    return {"cold": cold, "start_exit": done.returncode, "systemctl_start_s": round(time.monotonic() - began, 1),
            "left_after_wipe": wiped, **marks, **phases.spans(marks),
            "gate_to_first_success_s": round(later[0] - ready_at, 2) if later else None}


def restarts(args) -> int:
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, "systemd-restarts")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    box = attach(work)
    key = (Path(json.loads((work / "state.json").read_text())["root"]) / KEY_INSIDE.lstrip("/")).read_text().strip()
    try:
        for mode in ("warm", "cold"):
            report[mode] = restart_once(box, report, key, cold=mode == "cold")
            log(f"{mode}: {report[mode]}")
    finally:
        save_journals(box, out)
    return 0


BENCH_DIR_INSIDE = "/var/lib/pdserve-gpu"
BENCH_PLOT_INSIDE = f"{BENCH_DIR_INSIDE}/bench.png"
BENCH_HISTORY_INSIDE = f"{BENCH_DIR_INSIDE}/bench-history.jsonl"
BENCH_WORKLOADS_INSIDE = f"{BENCH_DIR_INSIDE}/bench-workloads.toml"
# `pdserve bench` runs as a transient unit of the container's systemd, its stdout, stderr and exit status in
# files: it outlives the device call that started it, and a later call on the same machine collects it.
BENCH_UNIT = "pdserve-gpu-bench.service"


def bench_file(name: str, directory: str = BENCH_DIR_INSIDE) -> str:
    """Where the transient unit's `name` (stdout, stderr, exit, started) lives: one naming for writer and reader."""
    return f"{directory}/bench.{name}"


BENCH_STDOUT_INSIDE, BENCH_STDERR_INSIDE, BENCH_EXIT_INSIDE = (bench_file(n) for n in ("stdout", "stderr", "exit"))
# When the bench started (epoch seconds) and its argv, for the call that collects it.
BENCH_STARTED_INSIDE = bench_file("started")
BENCH_WORKLOADS = Path(__file__).with_name("bench_workloads.toml")
BENCH_POLL_S = 5.0
# What a call keeps after the wait for the bench's end: the journals, the files, the report.
BENCH_COLLECT_S = 40.0
EXIT_STILL_RUNNING = 3


def bench_unit_argv(argv: list[str], directory: str = BENCH_DIR_INSIDE) -> list[str]:
    """`systemd-run` for `argv` as a transient unit whose stdout, stderr and exit status land in `directory`
    (the BENCH_*_INSIDE files). `argv` reaches the shell as positional parameters, never as shell text, and
    the file names through shlex.quote."""
    stdout, stderr, status = (shlex.quote(bench_file(n, directory)) for n in ("stdout", "stderr", "exit"))
    script = f'"$@" >{stdout} 2>{stderr}; echo $? >{status}'
    return ["systemd-run", f"--unit={BENCH_UNIT}", "--quiet", "--property=KillMode=mixed",
            "/bin/sh", "-c", script, "sh", *argv]


def bench(args) -> int:
    """`pdserve bench --compare single,pd` inside the container, as an operator runs it (issue 40's GPU tier):
    the tier's workload through smg on the PD pair, then on the single-server fallback after the real cutover,
    then PD restored. The first call starts it; a call whose budget ends before it does says so (exit 3) and
    the next call on the same machine goes on waiting and collects it. The report keeps pdserve's JSON; the
    plot comes back beside it; its progress (stderr) is copied to OUT/bench-progress.log as it runs. A bench that
    has ended is collected again, not run again: a new one needs a new container (`run`) or BENCH_STARTED_INSIDE
    removed."""
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    report = Report(out, "systemd-bench")
    box = attach(work)
    root = Path(json.loads((work / "state.json").read_text())["root"])

    def inside(path: str) -> Path:
        return root / path.lstrip("/")

    if inside(BENCH_STARTED_INSIDE).exists():
        ago = time.time() - json.loads(inside(BENCH_STARTED_INSIDE).read_text())["at"]
        log(f"the bench started {ago:.0f} s ago by an earlier call runs on: waiting for it")
    elif (code := start_bench(box, root, args.workload, report)) != 0:
        return code
    deadline = began + max(args.budget_s or 480, BENCH_COLLECT_S * 2) - BENCH_COLLECT_S
    progress = out / "bench-progress.log"
    while not inside(BENCH_EXIT_INSIDE).exists() and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            shutil.copy(inside(BENCH_STDERR_INSIDE), progress)
        time.sleep(BENCH_POLL_S)
    with contextlib.suppress(OSError):
        shutil.copy(inside(BENCH_STDERR_INSIDE), progress)
    started = json.loads(inside(BENCH_STARTED_INSIDE).read_text())
    started_at = started["at"]
    units = unit_timestamps(box)
    report["units_after"] = {u: units[u]["active"] for u in UNITS.values() if u in units}
    # Every unit the comparison started or stopped, the fallback's included: a cutover that failed is read
    # from its journal. One file: with the report, the plot, the history, the progress, the table and the call's
    # log, that makes 7 of the 8 files a device call brings back.
    save_journals_together(box, out, {**UNITS, "single": FALLBACK_UNIT})
    if not inside(BENCH_EXIT_INSIDE).exists():
        report["bench"] = {"running": True, "seconds_so_far": round(time.time() - started_at, 1)}
        log(f"the bench still runs after {report['bench']['seconds_so_far']} s (its progress: {progress.name}); "
            "run `run_on_device.sh bench` again on this machine to wait for it and collect it")
        return EXIT_STILL_RUNNING
    exit_code = int(inside(BENCH_EXIT_INSIDE).read_text().strip() or -1)
    stdout = inside(BENCH_STDOUT_INSIDE).read_text()
    try:
        result = json.loads(stdout)
    except ValueError:
        result = {"unreadable_stdout": stdout[-3000:]}
    stderr = inside(BENCH_STDERR_INSIDE).read_text()
    report["bench"] = {"argv": started["argv"], "exit": exit_code,
                       "seconds": round(inside(BENCH_EXIT_INSIDE).stat().st_mtime - started_at, 1),
                       "result": result, "stderr": stderr[-6000:]}
    if "sweeps" in result:
        (out / "bench.txt").write_text(table.bench_text(result) + "\n")
    if inside(BENCH_PLOT_INSIDE).exists():
        shutil.copy(inside(BENCH_PLOT_INSIDE), out / "bench.png")
    if inside(BENCH_HISTORY_INSIDE).exists():
        shutil.copy(inside(BENCH_HISTORY_INSIDE), out / "bench-history.jsonl")
    log(f"bench exit {exit_code} in {report['bench']['seconds']} s\n{stderr[-3000:]}")
    return exit_code


def start_bench(box: Container, root: Path, workload: str, report: Report) -> int:
    """Ask the client's imports, write the tier's workloads and an empty history where the container sees them,
    and start `pdserve bench` as a transient unit; 0 when it runs."""
    python = (root / PDSERVE_INSIDE.lstrip("/")).read_text().splitlines()[0][2:]
    env = ["/usr/bin/env", f"PYTHONPATH={SITE_INSIDE}", *[f"{k}={v}" for k, v in NO_MULTICAST.items()]]
    # The client's imports and the plot's library, asked first: a missing one is a finding, not a hang.
    probe = box.run([*env, python, "-c", "import sglang.benchmark.serving"], timeout=120, check=False)
    has_plot = box.run([*env, python, "-c", "import matplotlib"], timeout=60, check=False).returncode == 0
    report["client_imports"] = {"exit": probe.returncode, "stderr": probe.stderr[-1500:], "matplotlib": has_plot}
    if probe.returncode != 0:
        log(f"the benchmark client does not import here: {probe.stderr.strip()[-500:]}")
        return 1
    for path, text in ((BENCH_WORKLOADS_INSIDE, BENCH_WORKLOADS.read_text()), (BENCH_HISTORY_INSIDE, "")):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    for stale in (BENCH_STDOUT_INSIDE, BENCH_STDERR_INSIDE, BENCH_EXIT_INSIDE, BENCH_PLOT_INSIDE):
        (root / stale.lstrip("/")).unlink(missing_ok=True)
    argv = [*env, PDSERVE_INSIDE, "bench", "--config", CONFIG_INSIDE, "--workload", workload,
            "--workloads", BENCH_WORKLOADS_INSIDE, "--history", BENCH_HISTORY_INSIDE,
            "--compare", "single,pd", "--point-timeout", "120", "--json",
            # The deployment names no SGLang Python (the units get theirs through the drop-in's PYTHONPATH).
            "--sglang-python", python,
            *(["--plot", BENCH_PLOT_INSIDE] if has_plot else [])]
    (root / BENCH_STARTED_INSIDE.lstrip("/")).write_text(json.dumps({"at": time.time(), "argv": argv}) + "\n")
    try:
        box.run(bench_unit_argv(argv), timeout=60)
    except ContainerError as exc:
        (root / BENCH_STARTED_INSIDE.lstrip("/")).unlink(missing_ok=True)
        report["bench"] = {"argv": argv, "error": str(exc)}
        log(f"the bench did not start: {exc}")
        return 1
    log(f"started `pdserve bench --compare single,pd` as {BENCH_UNIT} in the container")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("smoke", "run", "restarts", "bench"))
    parser.add_argument("--unit-file", type=Path, help="smoke: a rendered prefill unit whose sandbox to apply")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pdgpu"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument("--budget-s", type=float, default=0.0, help="run: the seconds this call may take")
    parser.add_argument("--cold-restart-needs-s", type=float, default=200.0,
                        help="run: after the kill, a cold restart of the prefill if this much of the budget is left")
    parser.add_argument("--no-faults", action="store_true",
                        help="run: start the units and verify, nothing more (the machine's next call benches)")
    parser.add_argument("--workload", default="gpu-tier",
                        help="bench: the workload pdserve bench runs (a built-in or one of bench_workloads.toml)")
    args = parser.parse_args()
    return {"smoke": smoke, "run": run, "restarts": restarts, "bench": bench}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
