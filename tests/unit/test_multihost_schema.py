"""The multi-host schema: hosts and placements, and one clear problem for every bad placement, reported
with every other problem. The single-host file keeps reading as it always did."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from pdserve.render.renderable import renderable_from_data
from pdserve.schema.listeners import listeners
from pdserve.schema.loading import default_profile_text, load
from pdserve.schema.problems import ConfigError, Problem
from pdserve.schema.topology import Node, router_unit, server_unit, servers

ROOT = Path(__file__).resolve().parents[2]
TWO_HOST = ROOT / "hosts/two-host/deployment.toml"
FOUR_HOST = ROOT / "hosts/four-host/deployment.toml"


def two_host() -> dict:
    return tomllib.loads(TWO_HOST.read_text())


def problems_of(data: dict) -> list[Problem]:
    try:
        loaded = renderable_from_data(data, "test")
    except ConfigError as exc:
        return exc.problems
    return loaded.warnings


def one(problems: list[Problem], field: str) -> Problem:
    found = [p for p in problems if p.field == field]
    assert len(found) == 1, (field, [p.line() for p in problems])
    return found[0]


def test_the_examples_load_with_no_problem():
    for path in (TWO_HOST, FOUR_HOST):
        loaded = load(path)
        assert loaded.deployment.multi_host and loaded.warnings == [], [w.line() for w in loaded.warnings]


def test_single_host_file_without_fallback_still_reads_field_required():
    data = tomllib.loads(default_profile_text())
    del data["fallback"]
    problem = one(problems_of(data), "fallback")
    assert problem.line() == ("error: fallback = (unset): is required and missing; fix: add it (`pdserve schema` "
                              "describes it)")


def test_two_host_servers_and_listeners():
    dep = load(TWO_HOST).deployment
    placed = {s.name: s for s in servers(dep)}
    assert set(placed) == {"prefill-1", "decode-1"}
    assert placed["prefill-1"].url == "http://10.10.0.1:30000" and placed["prefill-1"].bootstrap_port == 8998
    assert placed["decode-1"].url == "http://10.10.0.2:30002" and placed["decode-1"].bootstrap_port is None
    found = {(item.host, item.first): item.reached_from for item in listeners(dep) if item.worker_port}
    # The decode's API: its router is on its own host (loopback), and the prefill's readiness gate on gpu-a
    # sends its warm-up hand-off through it.
    assert found == {("gpu-a", 30000): ("gpu-b",), ("gpu-a", 8998): ("gpu-b",), ("gpu-b", 30002): ("gpu-a",)}


def test_unit_names_unique_across_hosts():
    dep = load(FOUR_HOST).deployment
    units = [server_unit(dep, Node(s, rank)) for s in servers(dep) for rank in range(s.nnodes)]
    units += [router_unit(dep, h) for h in dep.router.hosts]
    assert len(units) == len(set(units))
    assert "sglang-dsv4-decode-1-node1" in units and "sglang-dsv4-prefill-2" in units


def test_an_unknown_host_names_the_known_ones():
    data = two_host()
    data["decode"][0]["hosts"] = ["gpu-c"]
    problem = one(problems_of(data), "decode[0].hosts")
    assert "names host 'gpu-c', which [hosts] does not declare" in problem.message
    assert "gpu-a, gpu-b" in problem.fix and "[hosts.gpu-c]" in problem.fix


@pytest.mark.parametrize("address, words", [
    ("127.0.0.1", "is a loopback address"),
    ("0.0.0.0", "is a wildcard address"),
    ("gpu-a.cluster", "is not an IP address"),
])
def test_a_cluster_address_is_a_reachable_ip(address, words):
    data = two_host()
    data["hosts"]["gpu-a"]["address"] = address
    problem = one(problems_of(data), "hosts.gpu-a.address")
    assert words in problem.message and "10.0.0.1" in problem.fix


@pytest.mark.parametrize("host, words", [
    ("0.0.0.0", "listens on every interface"),
    ("127.0.0.1", "is loopback"),
    ("gpu-b", "is a host's name"),
    ("10.10.0.9", "is not the cluster address of its host gpu-b (10.10.0.2)"),
])
def test_a_cross_host_listener_binds_the_cluster_address(host, words):
    data = two_host()
    data["decode"][0]["host"] = host
    problem = one(problems_of(data), "decode[0].host")
    assert words in problem.message and "hosts.gpu-b.address (10.10.0.2)" in problem.fix


def test_every_problem_at_once():
    data = two_host()
    data["hosts"]["gpu-b"]["address"] = "10.10.0.1"          # the same address twice
    data["decode"][0]["port"] = 30001                         # the router's port on gpu-b
    data["prefill"][0]["gpus"] = [4, 5, 6, 7, 8, 9, 10, 11]   # beyond gpu-a's 8 GPUs
    data["prefill"][0]["numa_node"] = 3                       # gpu-a has 2 NUMA nodes
    fields = {p.field for p in problems_of(data)}
    assert {"hosts.gpu-b.address", "router.port", "prefill[0].gpus", "prefill[0].numa_node"} <= fields


def test_ports_are_distinct_per_host_not_across_hosts():
    data = two_host()
    data["decode"][0]["port"] = 30000  # prefill's port, but on the other host: fine
    assert problems_of(data) == []
    data["decode"][0]["port"] = 29000
    problem = one(problems_of(data), "router.prometheus_port")
    assert "already used on host gpu-b by decode[0].port" in problem.message


def test_gpus_are_disjoint_per_host():
    data = two_host()
    second = copy.deepcopy(data["decode"][0]) | {"port": 30004, "gpus": [6, 7]}
    data["decode"].append(second)
    problem = one(problems_of(data), "decode[1].gpus")
    assert "shares GPU(s) [6, 7] of host gpu-b with decode[0].gpus" in problem.message


def test_multi_node_needs_a_dist_init_port_and_tp_counts_every_node():
    data = two_host()
    data["decode"][0]["hosts"] = ["gpu-b", "gpu-a"]
    data["decode"][0]["tp_size"] = 8
    data["prefill"][0]["gpus"] = [0, 1, 2, 3]
    found = problems_of(data)
    assert "its nodes meet at --dist-init-addr" in one(found, "decode[0].dist_init_port").message
    tp = one(found, "decode[0].tp_size")
    assert "8 in decode[0].gpus on each: 16" in tp.message and "tp_size = 16" in tp.fix


def test_rdma_devices_per_server_where_the_backend_needs_them():
    data = two_host()
    data["transfer"]["backend"] = "mooncake"
    del data["decode"][0]["ib_devices"]
    problem = one(problems_of(data), "decode[0].ib_devices")
    assert "mooncake moves KV over RDMA" in problem.message and "mlx5_0" in problem.fix
    data["decode"][0]["ib_devices"] = ["mlx5_7"]
    problem = one(problems_of(data), "decode[0].ib_devices")
    assert "names ['mlx5_7'], which host gpu-b does not have" in problem.message


def test_nixl_between_hosts_needs_a_transport_that_leaves_the_host():
    data = two_host()
    data["environment"]["UCX_TLS"] = "cuda_copy,cuda_ipc"
    problem = one(problems_of(data), "environment.UCX_TLS")
    assert "only transports within one host" in problem.message and "tcp" in problem.fix


def test_shapes_that_do_not_fit_the_file():
    data = two_host()
    data["prefill"] = data["prefill"][0]
    del data["prefill"]["hosts"], data["prefill"]["ib_devices"]
    data["router"]["hosts"] = []
    data["fallback"] = {"gpus": [0]}
    found = problems_of(data)
    assert "write [[prefill]]" in one(found, "prefill").fix
    assert "names no host" in one(found, "router.hosts").message
    assert one(found, "fallback").fix == "remove [fallback]"
    single = tomllib.loads(default_profile_text())
    single["decode"] = [single["decode"] | {"hosts": ["gpu-a"]}]
    single["router"]["hosts"] = ["gpu-a"]
    found = problems_of(single)
    assert "declares no [hosts]" in one(found, "decode").message
    assert "declares no [hosts]" in one(found, "router.hosts").message


def test_a_bad_field_of_a_placed_server_names_its_index():
    data = two_host()
    data["decode"][0]["port"] = "30002"
    problem = one(problems_of(data), "decode[0].port")
    assert problem.message == "is not a whole number"


def test_server_names_give_unique_units():
    data = two_host()
    data["prefill"][0]["name"] = "router"
    assert "the router's" in one(problems_of(data), "prefill[0].name").message
    data["prefill"][0]["name"] = "decode-1"
    problem = one(problems_of(data), "decode[0].name")
    assert "gives unit sglang-dsv4-decode-1.service, which prefill[0] already has" in problem.message


def test_monitoring_is_refused_on_several_hosts_until_it_renders_per_host():
    data = two_host()
    data["monitoring"] = {"enable": True}
    problem = one(problems_of(data), "monitoring.enable")
    assert "not supported for a multi-host deployment yet" in problem.message


def four_host() -> dict:
    return tomllib.loads(FOUR_HOST.read_text())


@pytest.mark.parametrize("change, field, words", [
    (lambda d: d["prefill"][0].__setitem__("dist_init_port", 6000), "prefill[0].dist_init_port",
     "only a multi-node server (several hosts) uses --dist-init-addr"),
    (lambda d: d["decode"][0].__setitem__("dist_init_port", 65530), "decode[0].dist_init_port",
     "leaves no room for the 6 ports SGLang binds above it"),
    (lambda d: d["decode"][0].__setitem__("bootstrap_port", 9000), "decode[0].bootstrap_port",
     "only a prefill binds a bootstrap port"),
    (lambda d: d["decode"][0].__setitem__("hosts", ["gpu-c", "gpu-c"]), "decode[0].hosts",
     "lists host(s) ['gpu-c'] twice"),
    (lambda d: d["router"].update(hosts=["gpu-c", "gpu-d"], host="10.20.0.3"), "router.host",
     "is one address, but routers run on 2 hosts (gpu-c, gpu-d)"),
    (lambda d: d.update(boot_layout="single"), "boot_layout", "boots the single-server fallback"),
    (lambda d: d["prefill"][1].__setitem__("port", 8998), "transfer.bootstrap_port",
     "is already used on host gpu-b by prefill[1].port"),
    (lambda d: d["decode"][0].__setitem__("port", 5003), "decode[0].dist_init_port",
     "is already used on host gpu-c by decode[0].port"),
    (lambda d: d["prefill"][0].update(numa_node=0), "prefill[0].numa_node",
     "GPU(s) [4, 5, 6, 7] sit on another node"),
    (lambda d: d["hosts"]["gpu-b"].update(numa_nodes=[[0, 1, 2, 3], [3, 4, 5, 6, 7]]), "hosts.gpu-b.numa_nodes",
     "lists GPU(s) [3] on more than one node"),
    (lambda d: d["hosts"]["gpu-b"].update(gpus=4, numa_nodes=[[0, 1], [2, 3, 4]]), "hosts.gpu-b.numa_nodes",
     "lists GPU(s) [4], but hosts.gpu-b.gpus is 4"),
])
def test_each_placement_rule_names_field_value_and_fix(change, field, words):
    data = four_host()
    change(data)
    problem = one(problems_of(data), field)
    assert words in problem.message and problem.fix, problem.line()


def test_routers_on_several_hosts_are_each_a_full_view():
    data = four_host()
    data["router"]["hosts"] = ["gpu-c", "gpu-d"]
    dep = renderable_from_data(data, "t").deployment
    assert [router_unit(dep, h) for h in dep.router.hosts] == ["sglang-dsv4-router-gpu-c", "sglang-dsv4-router-gpu-d"]
    found = {(item.host, item.first): item.reached_from for item in listeners(dep) if item.worker_port}
    assert found[("gpu-a", 30000)] == ("gpu-c", "gpu-d")   # both routers reach every server
    # The decode's API: from the other router, and from the prefills' hosts (their gates' warm-up hand-off).
    assert found[("gpu-c", 30002)] == ("gpu-d", "gpu-a", "gpu-b")


def test_a_bad_host_name_is_named_and_what_followed_from_it_too():
    data = two_host()
    data["hosts"]["GPU A"] = data["hosts"].pop("gpu-a")
    found = problems_of(data)
    assert "lowercase letters, digits and dashes" in one(found, 'hosts["GPU A"]').message
    assert "names host 'gpu-a', which [hosts] does not declare" in one(found, "prefill[0].hosts").message


def test_a_host_that_runs_nothing_is_a_warning():
    data = two_host()
    data["hosts"]["gpu-z"] = {"address": "10.10.0.9"}
    problem = one(problems_of(data), "hosts.gpu-z")
    assert problem.severity == "warning" and "runs nothing" in problem.message


def test_deployments_together_collide_per_host_address():
    from pdserve.schema.rules_across import validate_across

    first = load(TWO_HOST).deployment
    data = two_host()
    data["name"] = "other"
    data["hosts"]["gpu-a"]["address"] = "10.10.0.7"  # its own host there, gpu-b's address shared
    second = renderable_from_data(data, "t").deployment
    found = validate_across([first, second])
    assert {p.field for p in found} == {"other: decode[0].port", "other: router.port", "other: router.prometheus_port"}
    assert "two deployments on host 10.10.0.2" in found[0].message
    one_host = load().deployment.model_copy(update={"name": "ref"})
    assert validate_across([first, one_host]) == []   # one host and several: their ports are not compared


def test_check_says_why_it_does_not_check_a_host_of_several():
    from click.testing import CliRunner

    from pdserve.cli.main import main

    result = CliRunner().invoke(main, ["check", "-c", str(TWO_HOST), "--no-parsers", "--host"])
    assert result.exit_code == 0, result.output
    assert "host checks: off: deployment dsv4 spans hosts (gpu-a, gpu-b)" in result.output


def test_a_dist_init_port_on_a_one_host_server_is_refused_not_dropped():
    data = two_host()
    data["prefill"][0]["dist_init_port"] = 5000  # the two-host prefill runs on one host: the port would go nowhere
    problem = one(problems_of(data), "prefill[0].dist_init_port")
    assert problem.severity.name == "ERROR" and "would go nowhere" in problem.line()
