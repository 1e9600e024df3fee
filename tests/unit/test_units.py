"""Rendered unit files, parsed back and asserted property by property."""

from __future__ import annotations

import shlex

import pytest

from pdserve.render.argv import SYSTEM_PATH
from pdserve.render.toolchain import Toolchain, resolve_toolchain
from pdserve.render.units import command_line, environment_line, render_units
from pdserve.schema.derived import MISSING_KEY_STAND_IN
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError

CONFIG = "/etc/pdserve/dsv4.json"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """INI with repeated keys (Environment=, After=), as systemd reads it."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, value = line.split("=", 1)
        current.setdefault(key, []).append(value)
    return sections


@pytest.fixture
def units(reference, tools):
    return {u.name: parse_unit(u.text) for u in render_units(reference, tools, CONFIG)}


def test_four_units_with_the_contract_names(units):
    assert sorted(units) == ["sglang-dsv4", "sglang-dsv4-decode", "sglang-dsv4-prefill", "sglang-dsv4-router"]


def test_router_wants_and_follows_both_workers_but_does_not_require_them(units):
    unit = units["sglang-dsv4-router"]["Unit"]
    wants = " ".join(unit["Wants"]).split()
    assert {"sglang-dsv4-prefill.service", "sglang-dsv4-decode.service"} <= set(wants)
    after = unit["After"][0].split()
    assert {"sglang-dsv4-prefill.service", "sglang-dsv4-decode.service"} <= set(after)
    # Requires=, BindsTo=, PartOf= and Requisite= all carry a worker's stop or restart over to the router.
    assert not {"Requires", "BindsTo", "PartOf", "Requisite"} & set(unit)


def test_after_means_ready_through_a_bounded_gate(units, tools):
    for name, role in [("sglang-dsv4-prefill", "prefill"), ("sglang-dsv4-decode", "decode"),
                       ("sglang-dsv4-router", "router"), ("sglang-dsv4", "fallback")]:
        service = units[name]["Service"]
        gate = shlex.split(service["ExecStartPost"][0])
        assert gate[:3] == [tools.pdserve, "wait-ready", role]
        assert gate[gate.index("--config") + 1] == CONFIG
        start_timeout = int(service["TimeoutStartSec"][0])
        assert 0 < int(gate[gate.index("--timeout") + 1]) < start_timeout
    assert units["sglang-dsv4-prefill"]["Service"]["TimeoutStartSec"] == ["1800"]


def test_fallback_conflicts_with_every_pd_unit(units):
    conflicts = units["sglang-dsv4"]["Unit"]["Conflicts"][0].split()
    assert sorted(conflicts) == ["sglang-dsv4-decode.service", "sglang-dsv4-prefill.service",
                                 "sglang-dsv4-router.service"]
    for name in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"):
        assert units[name]["Unit"]["Conflicts"] == ["sglang-dsv4.service"]


def test_restart_policy_is_bounded(units):
    for unit in units.values():
        assert unit["Service"]["Restart"] == ["on-failure"]
        assert unit["Service"]["RestartSec"] == ["10"]
        assert unit["Unit"]["StartLimitBurst"] == ["5"]
        assert unit["Unit"]["StartLimitIntervalSec"] == ["3600"]


def test_graceful_stop(units):
    for unit in units.values():
        assert unit["Service"]["KillMode"] == ["mixed"]
        assert unit["Service"]["KillSignal"] == ["SIGTERM"]
        assert unit["Service"]["TimeoutStopSec"] == ["120"]


def test_a_sglang_worker_that_ends_its_stop_by_sigkill_stops_cleanly_and_still_restarts_after_a_kill(units):
    """SGLang 0.5.17 SIGKILLs itself at the end of every stop: that is a clean end for the three SGLang units, and a
    SIGKILL while one runs still restarts it. The router (smg) exits cleanly and keeps systemd's defaults."""
    for name in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4"):
        service = units[name]["Service"]
        assert service["SuccessExitStatus"] == ["SIGKILL"] and service["RestartForceExitStatus"] == ["SIGKILL"]
        assert service["Restart"] == ["on-failure"]
    router = units["sglang-dsv4-router"]["Service"]
    assert "SuccessExitStatus" not in router and "RestartForceExitStatus" not in router


def test_exec_start_is_the_rendered_argv(reference, tools, units):
    from pdserve.render.argv import launch

    for name, role in [("sglang-dsv4-prefill", "prefill"), ("sglang-dsv4-router", "router")]:
        assert units[name]["Service"]["ExecStart"] == [command_line(launch(reference, role, tools).argv)]


def test_pinned_environment_in_worker_units(units):
    env = units["sglang-dsv4-decode"]["Service"]["Environment"]
    assert '"UCX_TLS=cuda_copy,cuda_ipc,tcp"' in env
    assert '"CUDA_DEVICE_ORDER=PCI_BUS_ID"' in env
    assert '"HOME=%S/pdserve/dsv4"' in env  # a specifier systemd expands


def test_sglang_servers_find_the_sglang_envs_tools_first_on_path(units):
    """FlashInfer runs `ninja` by name at the first forward; a venv keeps it beside bin/python (GPU tier, H100,
    2026-12-05: the prefill died at its first graph capture without it). The router runs no JIT build."""
    wanted = environment_line("PATH", f"/opt/sglang/bin:{SYSTEM_PATH}")
    for name in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4"):
        paths = [e for e in units[name]["Service"]["Environment"] if e.startswith('"PATH=')]
        assert paths == [wanted], name
    assert not [e for e in units["sglang-dsv4-router"]["Service"]["Environment"] if e.startswith('"PATH=')]
    assert {"/usr/bin", "/bin", "/usr/sbin", "/sbin"} <= set(SYSTEM_PATH.split(":"))


def test_a_deployments_own_path_follows_the_sglang_envs_bin(reference_data, tools):
    reference_data["environment"] = {**reference_data.get("environment", {}), "PATH": "/opt/cuda/bin:/usr/bin"}
    reference_data["decode"]["env"] = {"PATH": "/decode only %n"}
    dep = deployment_from_data(reference_data, "t").deployment
    rendered = {u.name: parse_unit(u.text)["Service"]["Environment"] for u in render_units(dep, tools, CONFIG)}
    assert environment_line("PATH", "/opt/sglang/bin:/opt/cuda/bin:/usr/bin") in rendered["sglang-dsv4-prefill"]
    decode = [e for e in rendered["sglang-dsv4-decode"] if e.startswith('"PATH=')]
    assert decode == [environment_line("PATH", "/opt/sglang/bin:/decode only %n")]  # `%` escaped: literal
    assert decode == ['"PATH=/opt/sglang/bin:/decode only %%n"']


def test_an_sglang_python_whose_directory_has_a_colon_is_refused(reference, reference_data, tools):
    """':' separates PATH's entries: such a directory could not lead the servers' PATH, from any input."""
    with pytest.raises(ConfigError) as flag:
        resolve_toolchain(reference, {"sglang_python": "/opt/a:b/bin/python", "numactl": tools.numactl,
                                      "pdserve": tools.pdserve})
    (problem,) = flag.value.problems
    assert (problem.field, problem.value) == ("--sglang-python", "/opt/a:b/bin/python")
    assert "':'" in problem.message and "PATH" in problem.message
    for field, value in (("sglang_python", "/opt/a:b/bin/python"), ("sglang_venv", "/opt/a:b")):
        data = {**reference_data, "tools": {field: value}}
        with pytest.raises(ConfigError) as loaded:
            deployment_from_data(data, "t")
        assert any(f"tools.{field}" in p.field and "PATH" in p.message for p in loaded.value.problems), field
    # A ':' in the file name alone is harmless: only the directory goes on PATH.
    render_units(reference, Toolchain(**{**tools.__dict__, "sglang_python": "/opt/sglang/bin/py:thon"}), CONFIG)


def test_installed_for_boot(units):
    # The default boot layout is PD: its three units are wanted at boot, the fallback has no [Install].
    # tests/unit/test_boot_layout.py covers boot_layout = "single".
    for name in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"):
        assert units[name]["Install"]["WantedBy"] == ["multi-user.target"]
    assert "Install" not in units["sglang-dsv4"]


def test_api_key_only_as_a_credential(reference_data, tools):
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    dep = deployment_from_data(reference_data, "t").deployment
    rendered = {u.name: u for u in render_units(dep, tools, CONFIG)}
    router = parse_unit(rendered["sglang-dsv4-router"].text)["Service"]
    assert router["LoadCredential"] == ["api-key:/etc/pdserve/router.key"]
    assert "SetCredential" not in router  # the router must not start without its key
    for worker in ("sglang-dsv4-prefill", "sglang-dsv4-decode"):
        # The worker's gates (leave-routers, the warm-up's rejoin) call smg's keyed worker API; where the file
        # is missing (a host of its own) the stand-in lets the server start anyway and the gate says so.
        service = parse_unit(rendered[worker].text)["Service"]
        assert service["LoadCredential"] == ["api-key:/etc/pdserve/router.key"]
        assert service["SetCredential"] == [f"api-key:{MISSING_KEY_STAND_IN}"]
        assert "router.key" not in " ".join(service["ExecStart"] + service["ExecStartPre"])


def test_an_unkeyed_router_gives_its_workers_no_credential(reference_data, tools):
    dep = deployment_from_data(reference_data, "t").deployment
    for unit in render_units(dep, tools, CONFIG):
        assert "Credential" not in unit.text, unit.name


def test_values_are_escaped_for_systemd(reference_data, tools):
    reference_data["environment"]["SGLANG_NOTE"] = 'a "b" 100% $HOME'
    reference_data["model"]["path"] = "/models/my model"
    dep = deployment_from_data(reference_data, "t").deployment
    text = {u.name: u.text for u in render_units(dep, tools, CONFIG)}["sglang-dsv4-prefill"]
    assert 'Environment="SGLANG_NOTE=a \\"b\\" 100%% $HOME"' in text
    assert '--model-path "/models/my model"' in text


WORKERS = ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4")


def test_every_unit_is_sandboxed_without_capabilities(units):
    for unit in units.values():
        service = unit["Service"]
        assert service["CapabilityBoundingSet"] == [""] and service["NoNewPrivileges"] == ["yes"]
        assert service["ProtectSystem"] == ["strict"] and service["ProtectHome"] == ["read-only"]
        assert service["PrivateTmp"] == ["yes"] and service["RestrictNamespaces"] == ["yes"]
        # Where the servers write with ProtectSystem=strict: HOME (JIT caches) and XDG_CACHE_HOME.
        assert service["StateDirectory"] == ["pdserve/dsv4"] and service["CacheDirectory"] == ["pdserve/dsv4"]
        # One user for all units: RemoveIPC on one would delete the workers' /dev/shm segments.
        assert "RemoveIPC" not in service


def test_gpu_servers_reach_the_nvidia_and_rdma_devices_only(units):
    for name in WORKERS:
        service = units[name]["Service"]
        assert service["PrivateDevices"] == ["no"] and service["DevicePolicy"] == ["closed"]
        assert service["DeviceAllow"] == ["char-nvidia* rw", "char-infiniband_verbs rw"]
        assert "AF_NETLINK" in service["RestrictAddressFamilies"][0].split()
        # PyTorch and Triton map writable code; the CUDA IPC of the KV hand-off needs real user IDs.
        assert "MemoryDenyWriteExecute" not in service and "PrivateUsers" not in service
        assert service["LimitMEMLOCK"] == ["infinity"]


def test_the_router_gets_no_devices_and_no_writable_code(units):
    service = units["sglang-dsv4-router"]["Service"]
    assert service["PrivateDevices"] == ["yes"] and "DeviceAllow" not in service
    assert service["MemoryDenyWriteExecute"] == ["yes"] and service["PrivateUsers"] == ["yes"]
    assert service["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]


def test_no_sandbox_directive_is_set_twice(reference, tools):
    """A key repeated by mistake would silently override the first value (lists add up, which is meant
    only for DeviceAllow= and SystemCallFilter=)."""
    for unit in render_units(reference, tools, CONFIG):
        service = parse_unit(unit.text)["Service"]
        repeated = {k for k, v in service.items() if len(v) > 1} - {"Environment", "ExecStartPre", "DeviceAllow",
                                                                   "SystemCallFilter", "LoadCredential"}
        assert not repeated, (unit.name, repeated)
