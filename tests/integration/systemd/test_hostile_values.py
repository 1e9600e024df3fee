"""Hostile deployment values through real systemd 252: every value that `pdserve check` accepts reaches
the process byte for byte, and a value it refuses never becomes a unit (issue 14, item 1).

The units are rendered by the real `pdserve render`; a recorder stands in for every tool they execute
(tests/integration/systemd/recorder.py) and writes down the exact bytes systemd handed it. Those are
compared with what pdserve meant to run (`commands.launch()`), not with a re-parse of the unit text.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from pdserve.render.argv import SYSTEM_PATH, launch
from pdserve.render.renderable import renderable_from_data
from pdserve.render.toolchain import Toolchain
from pdserve.schema.derived import MISSING_KEY_STAND_IN
from tests.integration.systemd import recorder

pytestmark = pytest.mark.integration

NAME = "hostile"
# Everything systemd treats specially in a unit file, a command line or an assignment, plus text that
# Python or a terminal might (U+2028 is a line break to str.splitlines, not to systemd).
NASTY = "a  b $HOME ${HOME} $$ %n %% \"dq\" 'sq' \\ \\n \\x41 ; -x @y +z !w :v ü€😀 \u2028 end"
TOOL_DIR = "/opt/hostile tools $HOME %n ;x @+!-ü"
TOOLS = {
    "sglang_python": f"{TOOL_DIR}/bin/python $1",
    "numactl": f"{TOOL_DIR}/numactl %i",
    "pdserve": f"{TOOL_DIR}/pdserve ${{X}}",
}
CONFIG_PATH = "/etc/pdserve/hostile $HOME %n 'q'.json"
KEY_PATH = "/etc/pdserve/key $HOME %n ü.key"


def hostile_deployment() -> dict:
    extra = ["--flag-a", NASTY, ";", "\\;", "-", "", "--x=$FOO", "%%", "${HOME}", "'", '"', "\\"]
    return {
        "name": NAME,
        "model": {"path": f"/var/lib/models/{NASTY}", "served_name": NASTY, "chat_template": NASTY,
                  "reasoning_parser": "deepseek-v4", "tool_call_parser": "deepseekv4"},
        "prefill": {"gpus": [0], "numa_node": 0, "port": 31901, "extra_args": extra,
                    "env": {"PREFILL_ONLY": NASTY, "EMPTY": "", "SPACED": "  lead and trail  "}},
        "decode": {"gpus": [1], "port": 31902, "extra_args": [NASTY]},
        "transfer": {"bootstrap_port": 31903, "ib_devices": ["mlx5_0", "mlx5_1"]},
        "router": {"port": 31904, "prometheus_port": 31905, "api_key_file": KEY_PATH, "extra_args": [NASTY, "-"],
                   "env": {"ROUTER_ONLY": NASTY}},
        "environment": {"SHARED": NASTY, "PERCENT": "100%", "DOLLAR": "$PATH"},
        "fallback": {"gpus": [0, 1], "extra_args": ["--y", NASTY]},
        "systemd": {"start_timeout_sec": 60, "stop_timeout_sec": 10, "restart_sec": 1, "start_limit_burst": 100},
    }


def _render(container, data: dict, work, tools: dict[str, str], config_path: str) -> subprocess.CompletedProcess:
    source = work / f"{NAME}.json"
    source.write_text(json.dumps(data))
    env = container.env
    argv = [env.executable("pdserve"), "render", "-c", str(source),
            "--out", str(container.path("/etc/systemd/system")), "--config-path", config_path,
            "--sglang-python", tools["sglang_python"], "--numactl", tools["numactl"], "--pdserve", tools["pdserve"],
            # The tools are the container's recorders, rendered from outside it: no Python to ask here.
            "--no-python-check"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _units(container) -> list[str]:
    return [f"sglang-{NAME}-prefill.service", f"sglang-{NAME}-decode.service",
            f"sglang-{NAME}-router.service", f"sglang-{NAME}.service"]


@pytest.fixture
def hostile(container, tmp_path):
    recorder.install(container.path, container.env.python, list(TOOLS.values()))
    key = container.path(KEY_PATH)
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("k3y\n")
    key.chmod(0o600)
    yield tmp_path
    container.run(["systemctl", "stop", *_units(container)], timeout=120, check=False)
    for unit in _units(container):
        container.path(f"/etc/systemd/system/{unit}").unlink(missing_ok=True)
    container.run(["systemctl", "daemon-reload"], timeout=60, check=False)


def _record(container, unit: str, which: str) -> dict:
    invocation = container.run(["systemctl", "show", "-p", "InvocationID", "--value", unit]).stdout.strip()
    path = container.path(f"/var/lib/pdserve/{NAME}/{invocation}-{which}.json")
    assert path.exists(), f"{unit} left no {which} record; journal:\n{container.journal(unit)}"
    return recorder.read(path)


def test_every_accepted_value_reaches_the_process_byte_for_byte(container, hostile):
    data = hostile_deployment()
    done = _render(container, data, hostile, TOOLS, CONFIG_PATH)
    assert done.returncode == 0, done.stderr
    verified = container.run(["systemd-analyze", "verify", *[f"/etc/systemd/system/{u}" for u in _units(container)]],
                             timeout=120, check=False)
    assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr
    container.run(["systemctl", "daemon-reload"], timeout=60)

    dep = renderable_from_data(data, "t").deployment
    tools = Toolchain(**TOOLS)
    for role in ("prefill", "decode", "router", "fallback"):
        intended = launch(dep, role, tools)
        unit = f"{intended.unit}.service"
        started = container.run(["systemctl", "start", unit], timeout=120, check=False)
        assert started.returncode == 0, f"{unit}: {started.stderr}\n{container.journal(unit)}"
        main = _record(container, unit, "main")
        assert main["exe"] == intended.argv[0].encode()
        assert main["argv"] == [a.encode() for a in intended.argv[1:]], role
        for name, value in intended.env.items():
            assert main["env"].get(name.encode()) == value.encode(), (role, name)
        assert main["env"][b"HOME"] == f"/var/lib/pdserve/{NAME}".encode()
        if role != "router":
            # The SGLang Python's hostile directory leads the servers' PATH (FlashInfer runs `ninja` from it),
            # the bytes exactly as named: systemd expanded neither $HOME nor %n.
            assert main["env"][b"PATH"] == f"{TOOL_DIR}/bin:{SYSTEM_PATH}".encode(), role
        else:
            assert not main["env"].get(b"PATH", b"").startswith(TOOL_DIR.encode())
        if intended.credentials:
            assert b"CREDENTIALS_DIRECTORY" in main["env"]
        post = _record(container, unit, f"gate-{role}")
        assert post["exe"] == TOOLS["pdserve"].encode()
        assert post["argv"][:5] == [b"wait-ready", role.encode(), b"--config", CONFIG_PATH.encode(), b"--timeout"]
        if role in ("prefill", "decode"):
            # The worker left the routers first (ExecStartPre=), named by the same hostile config path.
            pre = _record(container, unit, f"leave-{role}")
            assert pre["exe"] == TOOLS["pdserve"].encode()
            assert pre["argv"][:4] == [b"leave-routers", role.encode(), b"--config", CONFIG_PATH.encode()]
            # The router's key reached the gates through LoadCredential=, from the hostile key path.
            creds = pre["env"][b"CREDENTIALS_DIRECTORY"].decode()
            shown = container.run(["cat", f"{creds}/api-key"], check=False)
            assert shown.stdout == "k3y\n", shown.stderr
        if role == "router":
            # The keyed launcher read the key from LoadCredential=, loaded from the hostile key path.
            creds = main["env"][b"CREDENTIALS_DIRECTORY"].decode()
            shown = container.run(["cat", f"{creds}/api-key"], check=False)
            assert shown.stdout == "k3y\n", shown.stderr
        container.run(["systemctl", "stop", unit], timeout=120, check=False)


def test_a_worker_starts_without_the_routers_key_file_and_its_gates_get_the_stand_in(container, hostile):
    """A PD server on a host without the router's key file (several hosts) must still start: systemd passes
    the unit's SetCredential= stand-in instead of failing the start, and the gates recognise it."""
    container.path(KEY_PATH).unlink()
    done = _render(container, hostile_deployment(), hostile, TOOLS, CONFIG_PATH)
    assert done.returncode == 0, done.stderr
    container.run(["systemctl", "daemon-reload"], timeout=60)
    unit = f"sglang-{NAME}-prefill.service"
    started = container.run(["systemctl", "start", unit], timeout=120, check=False)
    assert started.returncode == 0, f"{unit}: {started.stderr}\n{container.journal(unit)}"
    pre = _record(container, unit, "leave-prefill")
    creds = pre["env"][b"CREDENTIALS_DIRECTORY"].decode()
    shown = container.run(["cat", f"{creds}/api-key"], check=False)
    assert shown.stdout == MISSING_KEY_STAND_IN, shown.stderr
    # The router, which cannot serve without its key, has no stand-in: it fails to start, and says why.
    router = f"sglang-{NAME}-router.service"
    refused = container.run(["systemctl", "start", router], timeout=120, check=False)
    assert refused.returncode != 0
    assert "api-key" in container.journal(router) or "credential" in container.journal(router).lower()


REFUSED = {
    "the issue's reproducer": ("systemd", "user", "pdserve\nExecStartPre=+/bin/touch /pwned"),
    "a newline in an environment value": ("environment", "X", "a\nExecStartPre=+/bin/touch /pwned"),
    "a carriage return in the served name": ("model", "served_name", "m\rExecStartPre=+/bin/touch /pwned"),
    "NUL in an extra arg": ("decode", "extra_args", ["--a\0b"]),
    "a newline in the router host": ("router", "host", "127.0.0.1\nExecStartPre=+/bin/touch /pwned"),
    "a newline in the key path": ("router", "api_key_file", "/etc/k\nExecStartPre=+/bin/touch /pwned"),
    "a newline in WantedBy": ("systemd", "wanted_by", "multi-user.target\nExecStartPre=+/bin/touch /pwned"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_value_never_becomes_a_unit(container, hostile, case):
    section, key, value = REFUSED[case]
    data = hostile_deployment()
    data[section][key] = value
    for unit in _units(container):
        container.path(f"/etc/systemd/system/{unit}").unlink(missing_ok=True)
    done = _render(container, data, hostile, TOOLS, CONFIG_PATH)
    assert done.returncode == 1, done.stdout
    assert f"{section}.{key}" in done.stderr and "control character" in done.stderr, done.stderr
    assert [u for u in _units(container) if container.path(f"/etc/systemd/system/{u}").exists()] == []


def test_tools_and_config_path_from_flags_are_refused_like_values(container, hostile):
    data = hostile_deployment()
    bad = dict(TOOLS, numactl='/opt/quote"d/numactl')
    done = _render(container, data, hostile, bad, CONFIG_PATH)
    assert done.returncode == 1 and "--numactl" in done.stderr and "Executable name" in done.stderr, done.stderr
    done = _render(container, data, hostile, TOOLS, "/etc/pdserve/x\nExecStartPre=+/bin/touch /pwned")
    assert done.returncode == 1 and "--config-path" in done.stderr, done.stderr
    assert not container.path("/pwned").exists()
