"""What can be checked of the Nix side without nixpkgs (CI, Nix 2.8): every .nix file parses,
builtins-only evaluation agrees with pdserve, flake.lock matches flake.nix and pins only GitHub
revisions, and the uv lock files are current.

CI cannot have nixpkgs, so the flake's outputs, the module and the VM test are evaluated by the
evaluation tier (tests/nix/test_eval.py, marker nix_eval) on a developer machine
(docs/nix.md). PDSERVE_REQUIRE_NIX=1 / PDSERVE_REQUIRE_UV=1 (CI) turn the skips for a missing
nix-instantiate / uv into failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pdserve.schema.loading import load, parse_document
from tests.conftest import require_or_skip
from tests.nix.derived_cases import HOSTS, LOOPBACK_SPELLINGS, NOT_LOOPBACK

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "hosts" / "gpu-host" / "deployment.toml"
MODULE = REPO / "nixos-modules" / "pdserve.nix"
# The options of one deployment, and the helpers every file of the module reads (the schema among them).
DEPLOYMENT_OPTIONS = REPO / "nixos-modules" / "deployment.nix"
COMMON = REPO / "nixos-modules" / "common.nix"
SKIP_DIRS = {".git", ".venv", "node_modules", "result"}
HEX40 = re.compile(r"^[0-9a-f]{40}$")
SRI_SHA256 = re.compile(r"^sha256-[A-Za-z0-9+/]{43}=$")
TIMEOUT = 60


def nix_instantiate() -> str:
    found = shutil.which("nix-instantiate")
    require_or_skip(found is not None, "nix-instantiate is not installed (Debian: apt-get install nix-bin)",
                    "PDSERVE_REQUIRE_NIX")
    assert found is not None
    return found


def nix_eval(expression: str) -> Any:
    """Evaluate a builtins-only expression strictly and return it as JSON data."""
    result = subprocess.run(
        [nix_instantiate(), "--eval", "--strict", "--json", "-E", expression],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nix_files() -> list[Path]:
    files = []
    for path in REPO.rglob("*.nix"):
        if not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
            files.append(path)
    return sorted(files)


def test_the_nix_files_this_project_needs_exist() -> None:
    present = {p.relative_to(REPO).as_posix() for p in nix_files()}
    for required in ("flake.nix", "nixos-modules/pdserve.nix", "hosts/gpu-host/configuration.nix",
                     "hosts/gpu-host/hardware-configuration.nix", "pkg/sglang-env/default.nix",
                     "tests/nix/vm-test.nix"):
        assert required in present, f"{required} is missing"


@pytest.mark.parametrize("path", nix_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_nix_file_parses(path: Path) -> None:
    result = subprocess.run([nix_instantiate(), "--parse", str(path)],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{path.relative_to(REPO)} does not parse:\n{result.stderr}"


# --- builtins-only evaluation against pdserve ----------------------------------------------------

def nix_reads_deployment() -> dict[str, Any]:
    return nix_eval(f"builtins.fromTOML (builtins.readFile {DEPLOYMENT})")


def test_nix_reads_the_host_deployment_exactly_as_pdserve_does() -> None:
    from_nix = nix_reads_deployment()
    from_pdserve = parse_document(DEPLOYMENT.read_text(encoding="utf-8"), "toml", str(DEPLOYMENT))
    assert from_nix == from_pdserve


SCHEMA = REPO / "pkg" / "pdserve" / "schema" / "deployment.schema.json"
DERIVED = REPO / "nixos-modules" / "derived.nix"


def test_nix_judges_loopback_as_pdserve_does() -> None:
    """The module's openFirewall assertion and public-router warning use derived.nix's isLoopback."""
    from pdserve.schema.addresses import listen_host_problem
    from pdserve.schema.rules import is_loopback

    # `check` refuses the other spellings (non-canonical, zoned, IPv4-mapped: pdserve.schema.addresses), so
    # the two sides must agree on the listen addresses it accepts.
    accepted = [host for host in HOSTS if listen_host_problem(host) is None]
    assert {"127.0.0.1", "::1", "localhost", "127.foo", "0.0.0.0", "::"} <= set(accepted)
    cases = json.dumps(json.dumps(accepted))
    from_nix = nix_eval(f"map (import {DERIVED}).isLoopback (builtins.fromJSON {cases})")
    from_python = [is_loopback(host) for host in accepted]
    disagree = [(host, n, p) for host, n, p in zip(accepted, from_nix, from_python, strict=True) if n != p]
    assert not disagree, f"(host, Nix, Python): {disagree}"
    assert from_python == [host in LOOPBACK_SPELLINGS for host in accepted]
    assert set(HOSTS) == set(LOOPBACK_SPELLINGS) | set(NOT_LOOPBACK)


@pytest.mark.parametrize("name", ["dsv4", "a-2", "x"])
def test_nix_names_the_units_as_pdserve_does(reference_data, name: str) -> None:
    from typing import get_args

    from pdserve.schema.config import Role
    from pdserve.schema.derived import unit_name
    from pdserve.schema.loading import deployment_from_data

    reference_data["name"] = name
    dep = deployment_from_data(reference_data, "<test>").deployment
    assert nix_eval(f'(import {DERIVED}).unitNames "{name}"') == {role: unit_name(dep, role) for role in get_args(Role)}


# Deployments whose scrape jobs the module computes (derived.nix scrapeConfigs) and pdserve renders
# (pdserve.render.monitoring.scrape): the reference's defaults, and listeners on every address family the
# connect-host rule turns into something else (any-address, IPv6, the fallback's own host and port).
SCRAPE_VARIANTS: dict[str, dict[str, Any]] = {
    "reference": {},
    "public-router": {"name": "a-2", "router": {"host": "0.0.0.0", "prometheus_host": "::", "prometheus_port": 29100},
                      "monitoring": {"enable": True, "scrape_interval_secs": 5}},
    "ipv6-and-fallback": {
        "name": "x", "router": {"host": "::", "prometheus_host": "::1"},
        "prefill": {"host": "10.0.0.5", "allow_non_loopback": True},
        "decode": {"host": "::1"},
        "fallback": {"host": "0.0.0.0", "port": 31005},
        "monitoring": {"enable": True, "scrape_interval_secs": 60},
    },
    "fallback-on-ipv6": {"router": {"host": "0.0.0.0"}, "fallback": {"host": "fd00::1"},  # not link-local: refused
                         "monitoring": {"scrape_interval_secs": 10}},
}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("variant", SCRAPE_VARIANTS)
def test_nix_computes_the_scrape_jobs_pdserve_renders(reference_data, variant: str) -> None:
    """The module's services.prometheus.scrapeConfigs come from derived.nix, computed from the settings
    (reading the rendered file at evaluation would be import-from-derivation): they must be exactly
    Python's scrape_configs, job names, targets (connect_host), labels, interval and timeout."""
    from pdserve.render.monitoring.scrape import scrape_configs
    from pdserve.schema.loading import deployment_from_data

    data = merged(reference_data, SCRAPE_VARIANTS[variant])
    dep = deployment_from_data(data, "<test>").deployment
    settings = json.dumps(json.dumps(data))
    from_nix = nix_eval(f"(import {DERIVED}).scrapeConfigs (builtins.fromJSON (builtins.readFile {SCHEMA})) "
                        f"(builtins.fromJSON {settings})")
    assert from_nix == scrape_configs(dep)
    assert nix_eval(f"(import {DERIVED}).monitoringEnabled (builtins.fromJSON (builtins.readFile {SCHEMA})) "
                    f"(builtins.fromJSON {settings})") is dep.monitoring.enable


def test_nix_connects_to_a_listener_as_pdserve_does() -> None:
    from pdserve.schema.derived import connect_host

    hosts = ["0.0.0.0", "::", "127.0.0.1", "::1", "fe80::1%eth0", "localhost", "10.0.0.5", *HOSTS]
    from_nix = nix_eval(f"map (import {DERIVED}).connectHost (builtins.fromJSON {json.dumps(json.dumps(hosts))})")
    assert from_nix == [connect_host(host) for host in hosts]


def test_the_embedded_profile_is_the_host_file_byte_for_byte() -> None:
    embedded = REPO / "pkg" / "pdserve" / "schema" / "profiles" / "dsv4.toml"
    assert embedded.read_bytes() == DEPLOYMENT.read_bytes(), \
        f"copy {DEPLOYMENT.relative_to(REPO)} to {embedded.relative_to(REPO)}"


def module_writes(tmp_path: Path) -> Path:
    """The JSON the module hands pdserve for the gpu-host: the TOML as Nix reads it, plus the keys the
    module types, filled in as the module fills them: from the committed JSON Schema's defaults.
    (tests/nix/test_eval.py reads the real module's output against a real nixpkgs.)"""
    expression = f"""
      let
        settings = builtins.fromTOML (builtins.readFile {DEPLOYMENT});
        schema = builtins.fromJSON (builtins.readFile {SCHEMA});
        default = section: key: schema."$defs".${{section}}.properties.${{key}}.default;
      in
      settings // {{
        name = settings.name or "dsv4";
        boot_layout = settings.boot_layout or schema.properties.boot_layout.default;
        router = {{ host = default "RouterSpec" "host"; port = default "RouterSpec" "port";
                   prometheus_port = default "RouterSpec" "prometheus_port"; }} // (settings.router or {{ }});
        transfer = {{ bootstrap_port = default "TransferSpec" "bootstrap_port"; }} // (settings.transfer or {{ }});
        systemd = {{ user = default "SystemdSpec" "user"; group = default "SystemdSpec" "group";
                    wanted_by = default "SystemdSpec" "wanted_by"; }} // (settings.systemd or {{ }});
      }}
    """
    path = tmp_path / "pdserve-dsv4.json"
    path.write_text(json.dumps(nix_eval(expression)), encoding="utf-8")
    return path


def test_the_settings_the_module_writes_pass_pdserve_check(tmp_path: Path) -> None:
    path = module_writes(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "pdserve.cli.main", "check", "--no-host", "--no-parsers", "-c", str(path)],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_settings_the_module_writes_load_as_the_same_deployment(tmp_path: Path) -> None:
    assert load(module_writes(tmp_path)).deployment == load(DEPLOYMENT).deployment


def test_the_module_takes_its_defaults_from_the_committed_schema() -> None:
    """The module has no default of its own for a pdserve key: every typed settings option reads the
    schema (`schemaDefault`), so the schema test (tests/unit/test_schema.py) keeps them pdserve's.
    What the defaults evaluate to is checked against pdserve in tests/nix/test_eval.py."""
    text = DEPLOYMENT_OPTIONS.read_text(encoding="utf-8")
    settings_block = text[text.index("settings = mkOption {"):text.index("openFirewall = mkOption {")]
    literal_defaults = re.findall(r"\bdefault = (?!schemaDefault|schema\.|name;)([^;]+);", settings_block)
    assert literal_defaults == [], f"literal defaults in the module's settings options: {literal_defaults}"
    module = MODULE.read_text(encoding="utf-8")
    assert "types.submodule (import ./deployment.nix { inherit lib pkgs schema; })" in module
    assert "lib.importJSON ../pkg/pdserve/schema/deployment.schema.json" in COMMON.read_text(encoding="utf-8")


# --- flake.lock -----------------------------------------------------------------------------------

def flake_inputs() -> dict[str, Any]:
    # flake.nix is a plain attribute set; its `inputs` need no nixpkgs to evaluate.
    return nix_eval(f"(import {REPO / 'flake.nix'}).inputs")


def lock() -> dict[str, Any]:
    return json.loads((REPO / "flake.lock").read_text(encoding="utf-8"))


def test_flake_lock_is_well_formed_json_of_version_7() -> None:
    data = lock()
    assert data["version"] == 7
    assert data["root"] == "root"
    assert "root" in data["nodes"]


def test_flake_lock_pins_only_github_revisions() -> None:
    for name, node in lock()["nodes"].items():
        if name == "root":
            continue
        locked, original = node["locked"], node["original"]
        assert locked["type"] == "github" == original["type"], f"{name}: {locked['type']} input"
        assert "path" not in json.dumps(node).replace('"narHash"', ""), f"{name} records a path input"
        assert HEX40.match(locked["rev"]), f"{name}: rev {locked['rev']!r}"
        assert SRI_SHA256.match(locked["narHash"]), f"{name}: narHash {locked['narHash']!r}"
        assert isinstance(locked["lastModified"], int) and locked["lastModified"] > 1_700_000_000, name


def github_url(owner: str, repo: str, ref: str | None = None) -> str:
    return f"github:{owner}/{repo}" + (f"/{ref}" if ref else "")


def test_flake_lock_matches_the_inputs_of_flake_nix() -> None:
    inputs = flake_inputs()
    data = lock()
    nodes = data["nodes"]
    root_inputs = nodes["root"]["inputs"]
    assert set(root_inputs) == set(inputs), "flake.lock's root inputs differ from flake.nix's inputs"
    for name, spec in inputs.items():
        node = nodes[root_inputs[name]]
        original = node["original"]
        url = github_url(original["owner"], original["repo"], original.get("ref"))
        assert url.lower() == spec["url"].lower(), f"{name}: flake.nix says {spec['url']}, flake.lock {url}"
        follows = {k: v["follows"] for k, v in spec.get("inputs", {}).items()}
        locked_inputs = node.get("inputs", {})
        for sub, target in follows.items():
            assert locked_inputs.get(sub) == target.split("/"), f"{name}.inputs.{sub} should follow {target}"
        assert set(locked_inputs) == set(follows), f"{name}: flake.lock has inputs flake.nix does not follow"


def test_every_input_follows_the_one_nixpkgs() -> None:
    inputs = flake_inputs()
    for name, spec in inputs.items():
        if name == "nixpkgs":
            continue
        assert spec.get("inputs", {}).get("nixpkgs", {}).get("follows") == "nixpkgs", (
            f"{name} does not follow nixpkgs: write {name}.inputs.nixpkgs.follows = \"nixpkgs\";")


# --- uv lock files ----------------------------------------------------------------------------------

def uv() -> str:
    found = shutil.which("uv") or (str(Path(sys.executable).parent / "uv")
                                   if (Path(sys.executable).parent / "uv").exists() else None)
    require_or_skip(found is not None, "uv is not installed (pip install uv)", "PDSERVE_REQUIRE_UV")
    assert found is not None
    return found


@pytest.mark.parametrize("project", [".", "pkg/sglang-env"])
def test_uv_lock_is_current(project: str, tmp_path: Path) -> None:
    """`uv lock --check` against the committed lock, offline and with an empty cache: the lock alone
    must satisfy pyproject.toml (no network, nothing remembered from earlier runs)."""
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_OFFLINE": "1",
           "UV_PYTHON_DOWNLOADS": "never"}
    result = subprocess.run(
        [uv(), "lock", "--check", "--python", sys.executable],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO / project, env=env,
    )
    assert result.returncode == 0, f"{project}/uv.lock is stale; run `uv lock` there:\n{result.stderr}"


def test_sglang_env_pins_what_pdserve_is_pinned_to() -> None:
    from pdserve.schema import pins

    pyproject = tomllib.loads((REPO / "pkg" / "sglang-env" / "pyproject.toml").read_text(encoding="utf-8"))
    assert set(pyproject["project"]["dependencies"]) == {
        f"sglang=={pins.SGLANG_VERSION}",
        f"{pins.ROUTER_DISTRIBUTION}=={pins.ROUTER_VERSION}",
        f"nixl-cu13=={pins.NIXL_VERSION}",
    }
    locked = {p["name"]: p["version"] for p in
              tomllib.loads((REPO / "pkg" / "sglang-env" / "uv.lock").read_text(encoding="utf-8"))["package"]}
    assert locked["sglang"] == pins.SGLANG_VERSION
    assert locked[pins.ROUTER_DISTRIBUTION] == pins.ROUTER_VERSION
    assert "sglang-router" not in locked  # its successor, smg, is the router
    assert locked["nixl-cu13"] == pins.NIXL_VERSION
    assert "torch" not in {p["name"] for p in
                           tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))["package"]}, (
        "torch entered pdserve's own lock: the orchestrator's closure must stay free of it")
