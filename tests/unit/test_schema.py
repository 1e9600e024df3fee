"""The committed JSON Schema is the one the code produces, and the reference files agree."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pdserve.schema.loading import default_profile_text, json_schema, load

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_SCHEMA = ROOT / "pkg/pdserve/schema/deployment.schema.json"
HOST_DEPLOYMENT = ROOT / "hosts/gpu-host/deployment.toml"


def test_committed_schema_is_current():
    committed = json.loads(COMMITTED_SCHEMA.read_text())
    assert committed == json_schema(), "run: pdserve schema > pkg/pdserve/schema/deployment.schema.json"


def test_schema_describes_the_sections():
    schema = json_schema()
    # The fallback is required of a single-host file by a rule (a multi-host deployment has none):
    # tests/unit/test_multihost_schema.py holds that a file without it still gets "fallback: is required and missing".
    assert set(schema["required"]) == {"name", "model", "prefill", "decode"}
    assert {"transfer", "router", "environment", "systemd", "tools", "hosts", "fallback"} <= set(schema["properties"])


def test_host_deployment_is_the_embedded_default():
    assert load(HOST_DEPLOYMENT).deployment == load(None).deployment
    assert tomllib.loads(HOST_DEPLOYMENT.read_text()) == tomllib.loads(default_profile_text())


def test_toml_and_json_load_the_same(tmp_path):
    as_json = tmp_path / "dsv4.json"
    as_json.write_text(json.dumps(tomllib.loads(default_profile_text())))
    assert load(as_json).deployment == load(None).deployment
