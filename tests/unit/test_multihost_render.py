"""Rendering a multi-host deployment one host at a time: the right units on each host, the router in front of
every server, multi-node flags per node, gates that cross hosts, and each host's firewall ruleset (checked
by the real `nft -c`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.launch.gate import probe_for
from pdserve.render.argv import host_launches, router_args
from pdserve.render.firewall import render_firewall
from pdserve.render.toolchain import Toolchain
from pdserve.render.units import render_units
from pdserve.schema.loading import load
from pdserve.schema.placement import place
from tests.conftest import require_or_skip
from tests.fixtures.nft_check import require_nft

ROOT = Path(__file__).resolve().parents[2]
TWO_HOST = ROOT / "hosts/two-host/deployment.toml"
FOUR_HOST = ROOT / "hosts/four-host/deployment.toml"
TOOLS = Toolchain("/opt/sglang/bin/python", "/usr/bin/numactl", "/usr/bin/pdserve")
CONFIG = "/etc/systemd/system/pdserve-dsv4.json"
TOOL_FLAGS = ["--sglang-python", "/opt/sglang/bin/python", "--numactl", "/usr/bin/numactl",
              "--pdserve", "/usr/bin/pdserve"]
# A Python that is not here: render is told not to ask it, as for units made for another machine.
RENDER_FLAGS = [*TOOL_FLAGS, "--no-python-check"]


def units_of(path: Path, host: str) -> dict[str, str]:
    dep = load(path).deployment
    return {unit.name: unit.text for unit in render_units(dep, TOOLS, CONFIG, host)}


def directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def flag(argv: list[str] | tuple[str, ...], name: str) -> str:
    return argv[list(argv).index(name) + 1]


def test_each_host_gets_only_its_units():
    dep = load(TWO_HOST).deployment
    assert list(place(dep).units("gpu-a")) == ["sglang-dsv4-prefill-1"]
    assert list(place(dep).units("gpu-b")) == ["sglang-dsv4-decode-1", "sglang-dsv4-router"]
    four = load(FOUR_HOST).deployment
    assert {h: list(place(four).units(h)) for h in four.hosts} == {
        "gpu-a": ["sglang-dsv4-prefill-1"], "gpu-b": ["sglang-dsv4-prefill-2"],
        "gpu-c": ["sglang-dsv4-decode-1", "sglang-dsv4-router"], "gpu-d": ["sglang-dsv4-decode-1-node1"]}
    for host in four.hosts:
        assert list(units_of(FOUR_HOST, host)) == list(place(four).units(host))


def test_the_router_lists_every_server_on_its_cluster_address():
    args = router_args(load(FOUR_HOST).deployment)
    prefills = [args[i + 1:i + 3] for i, a in enumerate(args) if a == "--prefill"]
    decodes = [args[i + 1] for i, a in enumerate(args) if a == "--decode"]
    assert prefills == [["http://10.20.0.1:30000", "8998"], ["http://10.20.0.2:30000", "8998"]]
    assert decodes == ["http://10.20.0.3:30002"]


def test_multi_node_flags_per_node():
    dep = load(FOUR_HOST).deployment
    node0 = next(r for r in host_launches(dep, "gpu-c", TOOLS) if r.role == "decode").argv
    node1 = host_launches(dep, "gpu-d", TOOLS)[0].argv
    for argv, rank, host in ((node0, "0", "10.20.0.3"), (node1, "1", "10.20.0.4")):
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == rank
        assert flag(argv, "--dist-init-addr") == "10.20.0.3:5000"
        assert flag(argv, "--tp-size") == "16" and flag(argv, "--host") == host
    single = host_launches(dep, "gpu-a", TOOLS)[0].argv
    assert "--nnodes" not in single and flag(single, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"


def test_gates_cross_hosts():
    router = units_of(FOUR_HOST, "gpu-c")["sglang-dsv4-router"]
    gates = directives(router, "ExecStartPre")
    # The remote prefills load in parallel with nothing to order on: the gate waits up to their start timeout.
    assert [re.search(r"--server (\S+) .*--timeout (\d+)", g).groups() for g in gates] == [
        ("prefill-1", "1790"), ("prefill-2", "1790"), ("decode-1", "5")]
    assert directives(router, "TimeoutStartSec") == ["2100"]
    assert directives(router, "After") == ["network-online.target sglang-dsv4-decode-1.service"]
    node1 = units_of(FOUR_HOST, "gpu-d")["sglang-dsv4-decode-1-node1"]
    assert directives(node1, "ExecStartPost") == [
        "/usr/bin/pdserve wait-ready decode --server decode-1 --config /etc/systemd/system/pdserve-dsv4.json "
        "--timeout 1790 --interval 2"]
    assert "Conflicts" not in node1 and directives(node1, "WantedBy") == ["multi-user.target"]


def test_gate_probes_the_named_server_and_the_router_counts_every_server():
    dep = load(FOUR_HOST).deployment
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == "/readiness":
            return httpx.Response(200, json={"healthy_workers": 3, "total_workers": 3})
        return httpx.Response(200, json={"disaggregation_mode": "prefill"})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    assert probe_for(dep, "prefill", client, "prefill-2")().ready
    assert seen[0] == "http://10.20.0.2:30000/health"
    assert probe_for(dep, "router", client)().ready  # 3 of 3: two prefill servers and one decode
    two_of_three = httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json={"healthy_workers": 2, "total_workers": 2})))
    assert not probe_for(dep, "router", two_of_three)().ready
    with pytest.raises(ValueError, match="its prefill servers: prefill-1, prefill-2"):
        probe_for(dep, "prefill", client, "decode-1")
    with pytest.raises(ValueError, match="name the prefill server with --server"):
        probe_for(dep, "prefill", client)


def rules_of(ruleset: str) -> dict[str, list[str]]:
    """dport -> allowed source addresses, and "drop" -> the dropped ports."""
    found: dict[str, list[str]] = {}
    for line in ruleset.splitlines():
        allow = re.fullmatch(r"\s*tcp dport (\S+) ip6? saddr \{ (.*) \} accept", line)
        if allow:
            found[allow.group(1)] = allow.group(2).split(", ")
        drop = re.fullmatch(r"\s*tcp dport \{ (.*) \} counter drop", line)
        if drop:
            found["drop"] = drop.group(1).split(", ")
    return found


def test_firewall_opens_each_worker_port_only_to_its_users():
    dep = load(FOUR_HOST).deployment
    assert rules_of(render_firewall(dep, "gpu-a")) == {
        "30000": ["10.20.0.3"],                 # HTTP: the router's host
        "8998": ["10.20.0.3", "10.20.0.4"],     # bootstrap: both decode nodes
        "drop": ["30000", "8998"]}
    assert rules_of(render_firewall(dep, "gpu-c")) == {
        "30002": ["10.20.0.1", "10.20.0.2"],    # HTTP: the prefills' gates (warm-up); its router is on this host
        "5000-5006": ["10.20.0.4"],             # dist-init: the other node of decode-1
        "drop": ["30002", "5000-5006"]}
    assert rules_of(render_firewall(dep, "gpu-d")) == {"drop": ["30002"]}
    two = load(TWO_HOST).deployment
    assert rules_of(render_firewall(two, "gpu-a")) == {"30000": ["10.10.0.2"], "8998": ["10.10.0.2"],
                                                       "drop": ["30000", "8998"]}
    # The router's public port is not this ruleset's to decide.
    assert "30001" not in render_firewall(two, "gpu-b")


def test_firewall_speaks_ipv6_for_ipv6_hosts(tmp_path):
    path = tmp_path / "v6.toml"
    path.write_text(TWO_HOST.read_text().replace('"10.10.0.2"', '"fd00::2"'))
    ruleset = render_firewall(load(path).deployment, "gpu-a")
    assert "tcp dport 30000 ip6 saddr { fd00::2 } accept" in ruleset
    assert "http://[fd00::2]:30002" in router_args(load(path).deployment)


def test_every_hosts_ruleset_passes_the_real_nft_check(tmp_path):
    require_nft()
    for path in (TWO_HOST, FOUR_HOST):
        dep = load(path).deployment
        for host in dep.hosts:
            ruleset = tmp_path / f"{dep.name}-{host}.nft"
            ruleset.write_text(render_firewall(dep, host))
            done = subprocess.run(["nft", "-c", "-f", str(ruleset)], capture_output=True, text=True, timeout=30,
                                  check=False)
            assert done.returncode == 0, (path.name, host, done.stderr)
    # The check can fail: a rule nft does not know is refused.
    broken = tmp_path / "broken.nft"
    broken.write_text(render_firewall(load(TWO_HOST).deployment, "gpu-a").replace("counter drop", "counter dorp"))
    checked = subprocess.run(["nft", "-c", "-f", str(broken)], capture_output=True, timeout=30, check=False)
    assert checked.returncode != 0


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_render_without_host_refuses_and_lists_the_hosts(tmp_path):
    result = run("render", "-c", str(FOUR_HOST), "--out", str(tmp_path / "out"), *RENDER_FLAGS)
    assert result.exit_code == 2
    assert "spans hosts gpu-a, gpu-b, gpu-c, gpu-d" in result.output and "--host" in result.output
    assert not (tmp_path / "out").exists()
    result = run("render", "-c", str(FOUR_HOST), "--host", "gpu-x", "--out", str(tmp_path / "out"), *RENDER_FLAGS)
    assert result.exit_code == 2 and "its hosts: gpu-a, gpu-b, gpu-c, gpu-d" in result.output
    result = run("render", "--host", "gpu-a", "--out", str(tmp_path / "out"), *RENDER_FLAGS)
    assert result.exit_code == 2 and "declares no [hosts]" in result.output


def test_render_host_writes_its_units_json_and_ruleset(tmp_path):
    out = tmp_path / "gpu-b"
    result = run("render", "-c", str(TWO_HOST), "--host", "gpu-b", "--out", str(out), *RENDER_FLAGS)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "pdserve-dsv4-firewall.nft", "pdserve-dsv4.json", "sglang-dsv4-decode-1.service", "sglang-dsv4-router.service"]
    # The JSON is the whole deployment: the gates on this host read the other hosts' servers from it.
    assert load(out / "pdserve-dsv4.json").deployment == load(TWO_HOST).deployment


def test_plan_per_host():
    result = run("plan", "-c", str(FOUR_HOST), "--host", "gpu-d", "--json", *TOOL_FLAGS)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["host"] == "gpu-d" and list(data["roles"]) == ["decode-1 node 1"]
    assert data["roles"]["decode-1 node 1"]["tensor_parallel"] == 16
    assert list(data["units"]) == ["sglang-dsv4-decode-1-node1.service"]
    assert "table inet pdserve_dsv4" in data["firewall"]
    assert run("plan", "-c", str(FOUR_HOST), *TOOL_FLAGS).exit_code == 2


def test_every_hosts_units_verify_cleanly(tmp_path):
    """systemd-analyze verify (tests/unit/test_systemd_analyze.py's harness: any stderr line fails)."""
    from tests.unit.test_systemd_analyze import HOST_UNITS, analyze, make_root

    require_or_skip(shutil.which("systemd-analyze") is not None and HOST_UNITS.is_dir(),
                    "systemd-analyze or /usr/lib/systemd/system is missing", "PDSERVE_REQUIRE_SYSTEMD")
    for path in (TWO_HOST, FOUR_HOST):
        dep = load(path).deployment
        for host in dep.hosts:
            units = render_units(dep, TOOLS, CONFIG, host)
            done = analyze(make_root(tmp_path / path.parent.name / host, units, TOOLS), units)
            assert done.returncode == 0 and done.stderr.strip() == "", (path.name, host, done.stderr)


def test_every_example_argv_passes_the_real_parsers():
    """Each server's node-0 argv (--nnodes/--node-rank/--dist-init-addr included) and the router's argv with
    every server, through sglang 0.5.23's and smg 1.13.0's own parsers (pdserve.check.parsers)."""
    import importlib.util
    import sys

    from pdserve.check.parsers import check_with_parsers

    have = all(importlib.util.find_spec(m) is not None for m in ("sglang", "smg"))
    require_or_skip(have, "sglang and smg are not installed in this Python", "PDSERVE_REQUIRE_PARSERS")
    for path, fields in ((FOUR_HOST, ["prefill[0]", "prefill[1]", "decode[0]", "router"]),
                         (TWO_HOST, ["prefill[0]", "decode[0]", "router"])):
        report = check_with_parsers(load(path).deployment, sys.executable, required_by="test")
        assert report.problems == [] and report.checked == fields, (path.name, report)


def test_plain_host_plan_here_documents_write_the_exact_units_and_ruleset(tmp_path):
    """Piped, `plan --host` is copyable shell: its here-documents give back the unit files and the ruleset."""
    require_or_skip(shutil.which("bash") is not None, "bash is missing", "PDSERVE_REQUIRE_SYSTEMD")
    text = run("plan", "-c", str(FOUR_HOST), "--host", "gpu-a", *TOOL_FLAGS).output
    heredocs = "\n".join(re.findall(r"^cat > .*?^PDSERVE_UNIT_END$", text, re.MULTILINE | re.DOTALL))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["bash", "-c", heredocs], cwd=out, timeout=30, check=True)
    data = json.loads(run("plan", "-c", str(FOUR_HOST), "--host", "gpu-a", "--json", *TOOL_FLAGS).output)
    written = {p.name: p.read_text() for p in out.iterdir()}
    assert written == {**data["units"], "pdserve-dsv4-firewall.nft": data["firewall"]}
