"""Every listen address `check` accepts renders monitoring files the real promtool accepts, with scrape targets
that are exactly host:port; every address it cannot carry (a zone ID, a mapped or link-local address, ...) is
refused by `check` first. And the emitter's PromQL strings, template text and label values carry hostile
values through promtool's own parsers.

Needs promtool (Debian's `prometheus` package); CI installs it and sets PDSERVE_REQUIRE_PROMETHEUS=1.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pdserve.render.emit import prometheus
from pdserve.render.monitoring import ALERTS_FILE, PROMETHEUS_FILE, SCRAPE_FILE, monitoring_files
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from tests.integration import test_prometheus_rules

pytestmark = pytest.mark.integration
promtool = test_prometheus_rules.promtool  # the fixture, shared with the rules tests

PROMTOOL_TIMEOUT = 60
HOST_PORT = re.compile(r"(\[[0-9a-f:]+\]|[0-9.]+|[a-z0-9.-]+):[0-9]{1,5}")
CANDIDATES = [
    "127.0.0.1", "127.0.0.2", "0.0.0.0", "::", "::1", "localhost", "10.1.2.3", "2001:db8::5", "fd00::5",
    "metrics.example", "fe80::1%eth0", "::1%lo", "fe80::1%$(touch /tmp/x);", "fe80::1", "::ffff:127.0.0.1",
    "::ffff:0.0.0.0", "255.255.255.255", "224.0.0.1", "ff02::1", "169.254.0.1", "0:0:0:0:0:0:0:1",
    "LOCALHOST", "0x7f000001", "127.1", "[::1]", "::1]:9090", "a b", "",
]
HOSTILE = ['quote " backslash \\', "line\nbreak", "nel\x85 sep\u2028", "{{ template }}", "}} {{", "$labels",
           "emoji \U0001f600", "del\x7f"]


def _promtool(promtool: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *argv], cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT)


@pytest.mark.parametrize("field", ["router.prometheus_host", "router.host"])
def test_every_accepted_listen_address_renders_files_promtool_accepts(promtool, reference_data, tmp_path, field):
    _section, key = field.split(".")
    accepted = []
    for value in CANDIDATES:
        data = {**reference_data, "monitoring": {"enable": True},
                "router": {**reference_data["router"], key: value, "api_key_file": "/etc/pdserve/router.key"}}
        try:
            dep = deployment_from_data(data, "test").deployment
        except ConfigError as exc:
            bad = [p for p in exc.problems if p.field == field]
            assert bad and bad[0].value == value and bad[0].fix, (value, [p.line() for p in exc.problems])
            continue
        accepted.append(value)
        out = tmp_path / f"{len(accepted)}"
        out.mkdir()
        for name, text in monitoring_files(dep).items():
            (out / name).write_text(text, encoding="utf-8")
        scraped = [t for job in yaml.safe_load((out / SCRAPE_FILE).read_text())
                   for static in job["static_configs"] for t in static["targets"]]
        assert scraped and all(HOST_PORT.fullmatch(t) for t in scraped), (value, scraped)
        done = _promtool(promtool, "check", "config", PROMETHEUS_FILE, cwd=out)
        assert done.returncode == 0, (value, done.stdout + done.stderr)
    assert {"127.0.0.1", "::1", "0.0.0.0", "::", "2001:db8::5"} <= set(accepted)
    assert not {"fe80::1%eth0", "::1%lo", "::ffff:0.0.0.0", "255.255.255.255", "[::1]", ""} & set(accepted)


def test_hostile_values_pass_promtools_parsers_through_the_emitter(promtool, tmp_path):
    rules = {"groups": [{"name": "g", "rules": [
        {"alert": f"A{i}", "expr": f"up{{{prometheus.matcher('deployment', value)}}} == 0",
         "labels": {"deployment": prometheus.template_text(value)},  # alert labels are templates too
         "annotations": {"summary": f"{prometheus.template_text(value)}: the {{{{ $labels.role }}}} is down"}}
        for i, value in enumerate(HOSTILE)]}]}
    (tmp_path / ALERTS_FILE).write_text(prometheus.document(rules, "hostile\nvalues"), encoding="utf-8")
    done = _promtool(promtool, "check", "rules", ALERTS_FILE, cwd=tmp_path)
    assert done.returncode == 0 and f"SUCCESS: {len(HOSTILE)} rules found" in done.stdout, done.stdout + done.stderr
    config = {"scrape_configs": [{"job_name": f"j{i}", "static_configs": [
        {"targets": [prometheus.target("::1", 9000 + i)], "labels": prometheus.labels({"v": value})}]}
        for i, value in enumerate(HOSTILE)]}
    (tmp_path / PROMETHEUS_FILE).write_text(prometheus.document(config, "made\nhere"), encoding="utf-8")
    done = _promtool(promtool, "check", "config", PROMETHEUS_FILE, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The check can fail: a template pasted unescaped is code, and promtool refuses the unknown function.
    rules["groups"][0]["rules"][0]["annotations"]["summary"] = "{{ template }}"
    (tmp_path / ALERTS_FILE).write_text(prometheus.document(rules), encoding="utf-8")
    assert _promtool(promtool, "check", "rules", ALERTS_FILE, cwd=tmp_path).returncode != 0
