"""One placement: every deployment file, single- or multi-host, resolves into one frozen list of placed
processes, and that list names the same units, hosts and URLs as the units `render` writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pdserve.render.argv import host_launches, launches
from pdserve.render.toolchain import Toolchain
from pdserve.schema.loading import load
from pdserve.schema.placement import Placed, Placement, place
from pdserve.schema.topology import IMPLIED_HOST

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {name: ROOT / f"hosts/{name}/deployment.toml" for name in ("gpu-host", "two-host", "four-host")}
TOOLS = Toolchain(sglang_python="/opt/sglang/bin/python", numactl="/usr/bin/numactl", pdserve="/usr/bin/pdserve",
                  keyed_launcher="/usr/bin/pdserve-keyed-launch")


def placed(name: str) -> Placement:
    return place(load(EXAMPLES[name]).deployment)


def test_a_single_host_file_is_a_one_host_deployment():
    placement = place(load().deployment)  # the embedded reference deployment
    assert placement.hosts == (IMPLIED_HOST,)
    rows = [(p.role, p.host, p.node_rank, p.gpus, p.numa_node, p.port, p.unit, p.url) for p in placement.placed]
    assert rows == [
        ("prefill", "", 0, (0, 1, 2, 3), 0, 30000, "sglang-dsv4-prefill", "http://127.0.0.1:30000"),
        ("decode", "", 0, (4, 5, 6, 7), 1, 30002, "sglang-dsv4-decode", "http://127.0.0.1:30002"),
        ("router", "", 0, (), None, 30001, "sglang-dsv4-router", "http://127.0.0.1:30001"),
        ("fallback", "", 0, tuple(range(8)), None, 30001, "sglang-dsv4", "http://127.0.0.1:30001"),
    ]
    prefill = placement.of_role("prefill")[0]
    assert prefill.bootstrap_port == 8998 and prefill.dist_init_port is None and prefill.nnodes == 1
    assert placement.units(IMPLIED_HOST) == placement.units()


def test_the_reference_host_file_places_what_its_units_run():
    placement = placed("gpu-host")
    runs = launches(load(EXAMPLES["gpu-host"]).deployment, TOOLS)
    assert [(p.role, p.unit, p.url) for p in placement.placed] == [(r.role, r.unit, r.url) for r in runs.values()]


@pytest.mark.parametrize("name", ["two-host", "four-host"])
def test_each_host_runs_the_units_render_writes_for_it(name: str):
    dep = load(EXAMPLES[name]).deployment
    placement = place(dep)
    assert placement.hosts == tuple(dep.hosts)
    for host in placement.hosts:
        runs = host_launches(dep, host, TOOLS)
        assert [(p.role, p.unit, p.node_rank, p.url) for p in placement.on(host)] == [
            (r.role, r.unit, r.node_rank, r.url) for r in runs]
    assert not placement.of_role("fallback")  # a multi-host deployment has none
    assert len(set(placement.units())) == len(placement.placed)  # unit names are unique across hosts


def test_two_hosts():
    placement = placed("two-host")
    rows = [(p.role, p.name, p.host, p.gpus, p.unit, p.url) for p in placement.placed]
    assert rows == [
        ("prefill", "prefill-1", "gpu-a", tuple(range(8)), "sglang-dsv4-prefill-1", "http://10.10.0.1:30000"),
        ("decode", "decode-1", "gpu-b", tuple(range(8)), "sglang-dsv4-decode-1", "http://10.10.0.2:30002"),
        ("router", "router", "gpu-b", (), "sglang-dsv4-router", "http://127.0.0.1:30001"),
    ]
    assert placement.unit("sglang-dsv4-prefill-1") == placement.placed[0]
    assert placement.unit("sglang-dsv4") is None


def test_a_multi_node_server_is_one_process_per_host_with_its_rank():
    decode = placed("four-host").of_role("decode")
    assert [(p.host, p.node_rank, p.nnodes, p.unit, p.serves_api) for p in decode] == [
        ("gpu-c", 0, 2, "sglang-dsv4-decode-1", True),
        ("gpu-d", 1, 2, "sglang-dsv4-decode-1-node1", False),
    ]
    assert decode[0].dist_init_port == decode[1].dist_init_port is not None


def test_the_placement_is_frozen():
    placement = placed("two-host")
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.placed[0].port = 1  # type: ignore[misc]
    assert isinstance(placement.placed, tuple) and all(isinstance(p, Placed) for p in placement.placed)
