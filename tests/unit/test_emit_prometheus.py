"""The Prometheus emitter (pdserve.render.emit.prometheus): targets are exactly host:port, documents read back
as the data they were made from (as JSON and as YAML), PromQL strings and template text carry any value."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from pdserve.render.emit import EmitError, prometheus
from pdserve.render.monitoring import monitoring_files
from pdserve.render.monitoring.targets import targets
from pdserve.schema.loading import deployment_from_data

HOST_PORT = re.compile(r"(\[[0-9a-f:]+\]|[0-9.]+|[a-z0-9.-]+):[0-9]{1,5}")
HOSTILE = ["plain", 'quote " and \\ backslash', "line\nbreak", "nel\x85", "sep\u2028\u2029", "del\x7f c1\x9b",
           "bom\ufeff", "\ufffe\uffff", "emoji \U0001f600", "{{ $labels.x }}", "tab\tcr\r", "nul\x00", "}{ lone"]


@pytest.mark.parametrize("host, port, expected", [
    ("127.0.0.1", 29000, "127.0.0.1:29000"), ("::1", 29000, "[::1]:29000"),
    ("2001:db8::1", 1, "[2001:db8::1]:1"), ("gpu-a.example", 65535, "gpu-a.example:65535"),
])
def test_a_target_is_host_colon_port(host, port, expected):
    assert prometheus.target(host, port) == expected and HOST_PORT.fullmatch(expected)


@pytest.mark.parametrize("host, port", [
    ("fe80::1%eth0", 29000), ("::1%lo", 29000), ("fe80::1%$(touch /tmp/x);", 1), ("2001:DB8::1", 1),
    ("0:0:0:0:0:0:0:1", 1), ("a b", 1), ("host:1", 2), ("", 1), ("127.0.0.1", 0), ("127.0.0.1", 65536),
    ("127.0.0.1", True),
])
def test_a_target_that_is_not_host_colon_port_is_refused(host, port):
    with pytest.raises(EmitError):
        prometheus.target(host, port)


@pytest.mark.parametrize("prometheus_host, scraped", [
    ("127.0.0.1", "127.0.0.1:29000"), ("0.0.0.0", "127.0.0.1:29000"), ("::", "[::1]:29000"),
    ("::1", "[::1]:29000"), ("2001:db8::5", "[2001:db8::5]:29000"), ("localhost", "localhost:29000"),
])
def test_the_routers_scrape_target_for_each_accepted_listen_address(reference_data, prometheus_host, scraped):
    reference_data["router"]["prometheus_host"] = prometheus_host
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    dep = deployment_from_data(reference_data, "test").deployment
    router = next(t for t in targets(dep) if t.role == "router")
    assert router.address == scraped


@pytest.mark.parametrize("value", HOSTILE)
def test_a_document_reads_back_exactly_as_json_and_as_yaml(value):
    data = [{"job_name": "j", "static_configs": [{"targets": ["127.0.0.1:1"], "labels": {"v": value}}],
             "n": 1.5, "k": [value, {value: value}]}]
    text = prometheus.document(data, comment=f"made from {value}")
    head, body = text.split("\n", 1)
    assert head.startswith("# ") and "\n" not in head and "\r" not in head
    assert json.loads(body) == data
    assert yaml.safe_load(text) == data  # PyYAML reads YAML 1.1, whose line breaks include NEL and U+2028


def test_a_document_refuses_what_json_or_utf8_cannot_carry():
    for bad in (math.nan, math.inf, -math.inf, "lone \ud800 surrogate"):
        with pytest.raises(EmitError):
            prometheus.document({"x": bad})


def test_label_names_and_values():
    assert prometheus.labels({"deployment": "dsv4", "role": "router"}) == {"deployment": "dsv4", "role": "router"}
    for bad in ("1x", "a-b", "__name__", "", "a b"):
        with pytest.raises(EmitError):
            prometheus.label_name(bad)
    with pytest.raises(EmitError):
        prometheus.labels({"x": "\udc80"})


@pytest.mark.parametrize("value", HOSTILE)
def test_a_promql_string_is_one_quoted_literal(value):
    literal = prometheus.promql_string(value)
    assert literal.startswith('"') and literal.endswith('"')
    inner = literal[1:-1]
    # No unescaped quote inside, and no raw character a Go string literal cannot hold.
    assert not re.search(r'(?<!\\)(\\\\)*"', inner) and not re.search("[\x00-\x1f\x7f\u2028\u2029]", inner)
    assert prometheus.matcher("deployment", value) == f"deployment={literal}"


def test_template_text_is_text():
    assert prometheus.template_text("dsv4") == "dsv4"
    assert prometheus.template_text("{{ evil }}") == '{{ "{{ evil }}" }}'


def test_the_rendered_files_are_documents_of_host_port_targets(reference_data):
    reference_data["monitoring"] = {"enable": True}
    reference_data["router"]["prometheus_host"] = "::1"
    files = monitoring_files(deployment_from_data(reference_data, "test").deployment)
    scrape = yaml.safe_load(files["prometheus-scrape.yml"])
    found = [t for job in scrape for s in job["static_configs"] for t in s["targets"]]
    assert found and all(HOST_PORT.fullmatch(t) for t in found), found
    assert "[::1]:29000" in found
    assert json.loads(files["dashboard.json"])["uid"] == "pdserve-dsv4"
