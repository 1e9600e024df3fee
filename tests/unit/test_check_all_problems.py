"""Every problem of a multi-host file at once (issue 37, item 6): a host address that fails its own field
no longer hides the port clashes, GPU problems and other rule problems of the rest of the file, and the
summary says what ran instead of "checked: nothing"."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {name: tomllib.loads((REPO / "hosts" / name / "deployment.toml").read_text())
            for name in ("two-host", "four-host")}


def example(name: str) -> dict:
    return json.loads(json.dumps(EXAMPLES[name]))  # a fresh copy


def checked(tmp_path: Path, data: dict) -> dict:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "--json", "-c", str(path)])
    assert result.exit_code == 1, result.output
    return json.loads(result.stdout)


def fields(report: dict) -> set[str]:
    return {p["field"] for p in report["problems"] if p["severity"] == "error"}


# What breaks a host's address as a field: refused by the address's own validator, or missing, or a whole
# host table of the wrong type.
BAD_ADDRESSES = [
    pytest.param(lambda host: host.__setitem__("address", "not-an-ip"), id="not-an-ip"),
    pytest.param(lambda host: host.__setitem__("address", "10.0.0.256"), id="octet-out-of-range"),
    pytest.param(lambda host: host.__setitem__("address", "::1"), id="loopback"),
    pytest.param(lambda host: host.pop("address"), id="missing"),
    pytest.param(lambda host: host.__setitem__("address", 7), id="not-a-string"),
]


@pytest.mark.parametrize("breaks", BAD_ADDRESSES)
def test_a_bad_address_and_a_port_clash_come_together(tmp_path, breaks):
    data = example("two-host")
    breaks(data["hosts"]["gpu-a"])
    data["decode"][0]["port"] = data["router"]["port"]  # decode and the router share gpu-b
    report = checked(tmp_path, data)
    assert {"hosts.gpu-a.address", "router.port"} <= fields(report), report["problems"]
    # A missing address is no field error (the model leaves it unset, a host rule refuses it): every rule ran.
    ran = "schema and field rules" if "address" not in data["hosts"]["gpu-a"] else \
        "schema and field rules (the cross-field rules without the fields in error)"
    assert ran in report["checked"]


@pytest.mark.parametrize("breaks", BAD_ADDRESSES)
def test_a_bad_address_and_a_bad_gpu_index_come_together(tmp_path, breaks):
    data = example("four-host")
    breaks(data["hosts"]["gpu-d"])
    data["prefill"][1]["gpus"] = [0, 1, 2, 3, 4, 5, 6, 8]  # gpu-b has 8 GPUs
    report = checked(tmp_path, data)
    found = {p["field"]: p for p in report["problems"]}
    assert "hosts.gpu-d.address" in found and "prefill[1].gpus" in found, report["problems"]
    assert any("names GPU(s) [8]" in p["message"] for p in report["problems"] if p["field"] == "prefill[1].gpus")


def test_a_zone_id_address_never_hides_the_other_problems(tmp_path):
    # fe80::1%eth0 is refused as a cluster address (issue 37, item 2) or accepted: either way the rest is told.
    data = example("two-host")
    data["hosts"]["gpu-a"]["address"] = "fe80::1%eth0"
    data["decode"][0]["port"] = data["router"]["port"]
    assert "router.port" in fields(checked(tmp_path, data))


def test_every_field_error_of_the_placed_servers_and_a_rule_problem_come_together(tmp_path):
    data = example("four-host")
    data["hosts"]["gpu-a"]["address"] = "not-an-ip"
    data["prefill"][0]["gpus"] = [0, -1]             # a field error inside a placed server
    data["prefill"][1]["port"] = 70000                # another one, in another server
    data["decode"][0]["dist_init_port"] = 30001       # a rule problem: 30001-30007 holds the router's port
    report = checked(tmp_path, data)
    assert {"hosts.gpu-a.address", "prefill[0].gpus.1", "prefill[1].port", "decode[0].dist_init_port"} <= fields(
        report), report["problems"]


def test_a_whole_host_of_the_wrong_type_still_reports_the_rest(tmp_path):
    data = example("two-host")
    data["hosts"]["gpu-a"] = 5
    data["decode"][0]["port"] = data["router"]["port"]
    assert {"hosts.gpu-a", "router.port"} <= fields(checked(tmp_path, data))


def test_a_replaced_address_raises_no_problem_of_its_own(tmp_path):
    # The stand-in for a bad address is pdserve's, not the user's: nothing about it is reported.
    data = example("four-host")
    for host in data["hosts"].values():
        host["address"] = "not-an-ip"
    report = checked(tmp_path, data)
    assert fields(report) == {f"hosts.{name}.address" for name in data["hosts"]}, report["problems"]
    assert not any("10.254." in json.dumps(p) for p in report["problems"])


def test_the_summary_names_what_ran(tmp_path):
    data = example("two-host")
    data["decode"][0]["port"] = data["router"]["port"]  # a rule problem only: every field loads
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "-c", str(path)])
    assert "checked: schema and field rules)" in result.stdout and "checked: nothing" not in result.stdout
    # A file that cannot be parsed says how far the check got.
    path.write_text("{")
    result = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "-c", str(path)])
    assert "checked: the JSON syntax, which failed: no field was reached)" in result.stdout


def test_the_loader_reports_the_same_at_the_api(tmp_path):
    data = example("two-host")
    data["hosts"]["gpu-b"]["address"] = "not-an-ip"
    data["decode"][0]["port"] = data["router"]["port"]
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "t")
    assert {"hosts.gpu-b.address", "router.port"} <= {p.field for p in caught.value.problems}
    assert caught.value.checked


def test_a_hosts_section_of_the_wrong_type_is_told_without_rules_about_another_shape(tmp_path):
    # Replacing [hosts] would make the file a one-host file, and every rule would judge that layout instead.
    data = example("two-host")
    data["hosts"] = 5
    report = checked(tmp_path, data)
    assert fields(report) == {"hosts"}, report["problems"]
    assert report["checked"] == ["field types and bounds"]
    assert any("[hosts] is not a table of hosts" in reason for reason in report["skipped"])


# Independent mistakes spread over both hosts of two-host, each a different rule's: gpu-a's prefill (a GPU
# index its host lacks, a dist_init_port on a one-host server), gpu-b's decode (the router's port, a
# bootstrap port) and the router's placement (an undeclared host).
INDEPENDENT_MISTAKES = {
    "prefill[0].gpus": lambda d: d["prefill"][0].__setitem__("gpus", [0, 1, 2, 3, 4, 5, 6, 8]),
    "prefill[0].dist_init_port": lambda d: d["prefill"][0].__setitem__("dist_init_port", 5000),
    "router.port": lambda d: d["decode"][0].__setitem__("port", d["router"]["port"]),
    "decode[0].bootstrap_port": lambda d: d["decode"][0].__setitem__("bootstrap_port", 9000),
    "router.hosts": lambda d: d["router"].__setitem__("hosts", ["gpu-b", "gpu-c"]),
}


def test_every_rule_problem_of_a_multi_host_file_comes_in_one_run(tmp_path):
    # As on a single-host file, one run reports each mistake: what each raises alone, the run with all of
    # them raises too (none hides another), and nothing stops after the first host's.
    alone: dict[str, set[tuple[str, str]]] = {}
    for field, mistake in INDEPENDENT_MISTAKES.items():
        data = example("two-host")
        mistake(data)
        report = checked(tmp_path, data)
        alone[field] = {(p["field"], p["message"]) for p in report["problems"] if p["severity"] == "error"}
        assert field in {f for f, _ in alone[field]}, report["problems"]
    data = example("two-host")
    for mistake in INDEPENDENT_MISTAKES.values():
        mistake(data)
    report = checked(tmp_path, data)
    together = {(p["field"], p["message"]) for p in report["problems"] if p["severity"] == "error"}
    for field, problems in alone.items():
        assert problems <= together, (field, problems - together)
    assert report["checked"] == ["schema and field rules"]
