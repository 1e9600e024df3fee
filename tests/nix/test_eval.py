"""The evaluation tier: the flake against a real nixpkgs, on a developer machine (marker nix_eval).

Every output evaluates with no error and no evaluation warning, and the evaluated configuration does
what the module promises: boot layout -> wantedBy, openFirewall -> the router port only, apiKeyFile ->
LoadCredential= with nothing of the key in the store, every assertion fires with its message, defaults
are pdserve's, settings.monitoring.enable -> Prometheus' scrape jobs and rule files and Grafana's
provisioning on a host that runs them. Nothing is built (no binary cache here).

It needs what CI cannot have (code from elsewhere is never committed), given by environment variables:
  PDSERVE_EVAL_NIX                 a Nix >= 2.18 command (words split like a shell), e.g. a chroot wrapper
  PDSERVE_EVAL_NIXPKGS             flake reference of a prepared nixpkgs tree (git+file:///...?rev=...)
  PDSERVE_EVAL_PYPROJECT_NIX       flake references of the three pyproject inputs
  PDSERVE_EVAL_UV2NIX
  PDSERVE_EVAL_BUILD_SYSTEM_PKGS
docs/nix.md ("The evaluation tier") says how to prepare them. Without them every test here skips with that reason;
PDSERVE_REQUIRE_EVAL=1 turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdserve.render.hardening import sandbox
from pdserve.render.monitoring import ALERTS_FILE, DASHBOARD_FILE, monitoring_files
from pdserve.render.monitoring.dashboard import dashboard
from pdserve.render.monitoring.scrape import scrape_configs
from pdserve.render.toolchain import Toolchain
from pdserve.render.units import render_units
from pdserve.schema.config import Deployment
from pdserve.schema.loading import deployment_from_data, load
from pdserve.schema.pins import NIXL_DISTRIBUTION, NIXL_VERSION, ROUTER_DISTRIBUTION, ROUTER_VERSION, SGLANG_VERSION
from pdserve.schema.rules import is_loopback
from pdserve.schema.rules_across import listeners
from tests.conftest import require_or_skip
from tests.nix.derived_cases import HOSTS

pytestmark = pytest.mark.nix_eval

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "nix" / "eval-cases.nix"
INPUTS = {
    "nixpkgs": "PDSERVE_EVAL_NIXPKGS",
    "pyproject-nix": "PDSERVE_EVAL_PYPROJECT_NIX",
    "uv2nix": "PDSERVE_EVAL_UV2NIX",
    "pyproject-build-systems": "PDSERVE_EVAL_BUILD_SYSTEM_PKGS",
}
TIMEOUT = 900
EVALUATION_WARNING = re.compile(r"^(evaluation warning|trace: warning):", re.M)
SYSTEM = "x86_64-linux"


@dataclass(frozen=True)
class Evaluator:
    nix: list[str]
    overrides: list[str]

    def run(self, *args: str, expect_ok: bool = True) -> subprocess.CompletedProcess[str]:
        command = [*self.nix, *args, "--no-write-lock-file", "--no-eval-cache", *self.overrides]
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
        if expect_ok:
            assert result.returncode == 0, f"{shlex.join(args)} failed:\n{result.stderr[-6000:]}"
            assert not EVALUATION_WARNING.search(result.stderr), f"{shlex.join(args)} warned:\n{result.stderr}"
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run("eval", "--json", *args).stdout)


@pytest.fixture(scope="module")
def nix() -> Evaluator:
    return evaluator()


def evaluator() -> Evaluator:
    """The tier's Nix with the prepared inputs; skips (fails under PDSERVE_REQUIRE_EVAL=1) without them."""
    missing = [name for name in ("PDSERVE_EVAL_NIX", *INPUTS.values()) if not os.environ.get(name)]
    require_or_skip(
        not missing,
        f"{', '.join(missing)} not set: the evaluation tier needs a Nix >= 2.18 and a prepared nixpkgs tree "
        "with the pyproject inputs, which CI cannot have (docs/nix.md)",
        "PDSERVE_REQUIRE_EVAL",
    )
    nix = shlex.split(os.environ["PDSERVE_EVAL_NIX"])
    version = subprocess.run([*nix, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"(\d+)\.(\d+)", version)
    assert found and (int(found[1]), int(found[2])) >= (2, 18), f"{version.strip()}: nixpkgs needs Nix >= 2.18"
    overrides = [arg for name, env in INPUTS.items() for arg in ("--override-input", name, os.environ[env])]
    return Evaluator(nix, overrides)


@pytest.fixture(scope="module")
def key_file() -> Iterator[tuple[Path, str]]:
    """A key file with content found nowhere else: if it reaches the store, the closure scan finds it."""
    marker = f"pdserve-eval-key-{uuid.uuid4().hex}"
    # Not under /tmp (pytest's tmp_path): `pdserve check`, which the module runs at build time, refuses a key
    # file where any user can create it (pdserve.render.reach).
    parent = Path.home() / ".cache" / "pdserve-tests"
    parent.mkdir(parents=True, exist_ok=True)
    keys = Path(tempfile.mkdtemp(prefix="keys-", dir=parent))
    path = keys / f"api-key-{uuid.uuid4().hex[:12]}"
    path.write_text(marker + "\n", encoding="utf-8")
    yield path, marker
    shutil.rmtree(keys, ignore_errors=True)


def reference() -> Deployment:
    return load(REPO / "hosts" / "gpu-host" / "deployment.toml").deployment


# Python's list of a deployment's listeners; the module must know every one of them.
LISTENER_FIELDS = [listener.field for listener in listeners(reference())]
# Router addresses for the module's openFirewall assertion (each one a system evaluation): where the
# module's old "127." prefix test and Python disagreed, and one plain case of each side. CI's
# tests/nix/test_nix.py holds derived.nix against every case of derived_cases.HOSTS.
EVAL_HOSTS = ["127.0.0.1", "0:0:0:0:0:0:0:1", "::0.0.0.1", "::1%lo", "127.foo", "127.1", "0.0.0.0", "::"]
assert set(EVAL_HOSTS) <= set(HOSTS)


@pytest.fixture(scope="module")
def cases(nix: Evaluator, key_file: tuple[Path, str]) -> dict[str, Any]:
    """Everything read from the gpu-host and its variants, in one evaluation."""
    path, _ = key_file
    fields = json.dumps(json.dumps(LISTENER_FIELDS))  # a Nix string holding JSON
    hosts = json.dumps(json.dumps(EVAL_HOSTS))
    variants = f"import {CASES} {{ inherit host; keyFile = {json.dumps(str(path))}; " \
               f"listenerFields = builtins.fromJSON {fields}; loopbackHosts = builtins.fromJSON {hosts}; }}"
    return nix.json("--impure", ".#nixosConfigurations.gpu-host", "--apply", f"host: ({SELECTION}) ({variants})")


# What the tests below read of eval-cases.nix (one evaluation; each field is evaluated only if named).
SELECTION = """c: {
  inherit (c) nvidia bare;
  inherit (c) loopback;
  host = { inherit (c.host) failed warnings wantedBy unitDrvs serviceConfig allowedTCPPorts settings configFiles
    toplevel path sglangPackage numactl; };
  single = { inherit (c.single) failed warnings wantedBy; };
  openFirewall = { inherit (c.openFirewall) failed warnings allowedTCPPorts settings toplevel; };
  twoDeployments = { inherit (c.twoDeployments) failed warnings configFiles; };
  collisions = builtins.mapAttrs (_: v: v.failed) c.collisions;
  inherit (c) monitoring monitoringTwo monitoringWithoutServices servicesWithoutMonitoring monitoringWiringOff;
  # Not its toplevel: building that prints the warnings this case expects, which the tier refuses.
  monitoringWiringWithoutServices = { inherit (c.monitoringWiringWithoutServices) failed warnings grafana; };
  grafanaProvisionedByFiles = { inherit (c.grafanaProvisionedByFiles) failed warnings grafana scrapeConfigs; };
} // builtins.mapAttrs (_: v: { inherit (v) failed warnings; }) {
  inherit (c) openFirewallOnLoopback openFirewallWithoutKey publicWithoutKey relativeKey storeKey
    fallbackCollision sameName unitNameOfAnother;
}"""


# --- every output evaluates, without warnings ----------------------------------------------------

def test_flake_show_lists_every_output(nix: Evaluator):
    shown = json.loads(nix.run("flake", "show", "--json").stdout)
    assert set(shown["packages"][SYSTEM]) == {"default", "pdserve", "sglang-env", "kernels"}
    assert set(shown["checks"][SYSTEM]) == {"pytest", "treefmt", "gpu-host-eval", "multi-host-eval",
                                            "gpu-host-settings", "vm-test"}
    assert "gpu-host" in shown["nixosConfigurations"] and "default" in shown["nixosModules"]
    # tests/nix/test_eval_hosts.py holds the multi-host examples' systems.
    assert {"two-host-gpu-a", "four-host-gpu-d"} <= set(shown["nixosConfigurations"])
    assert "verify" in shown["apps"][SYSTEM] and "default" in shown["devShells"][SYSTEM]


def test_flake_check_without_building(nix: Evaluator):
    result = nix.run("flake", "check", "--no-build")
    evaluated = re.findall(r"derivation evaluated to (/nix/store/\S+\.drv)", result.stderr)
    assert len(evaluated) >= 12, result.stderr  # 4 packages, formatter, devShell, 6 checks


def test_every_output_evaluates(nix: Evaluator):
    drvs = nix.json(".#packages." + SYSTEM, "--apply", "ps: builtins.mapAttrs (_: p: p.drvPath) ps")
    assert set(drvs) == {"default", "pdserve", "sglang-env", "kernels"}
    shell = nix.json(f".#devShells.{SYSTEM}.default.drvPath")
    program = nix.json(f".#apps.{SYSTEM}.verify.program")
    checks = nix.json(f".#checks.{SYSTEM}", "--apply", "cs: builtins.mapAttrs (_: c: c.drvPath) cs")
    for path in [*drvs.values(), shell, *checks.values()]:
        assert re.fullmatch(r"/nix/store/[a-z0-9]{32}-.+\.drv", path), path
    assert re.fullmatch(r"/nix/store/[a-z0-9]{32}-pdserve-verify/bin/pdserve-verify", program), program


def test_the_sglang_env_holds_the_kernels_distribution_sglang_finds_its_plugin_by(nix: Evaluator):
    """pkg/sglang-env/kernels.nix (issue 16 item 4): the environment the units run has pdserve-kernels as a
    distribution built by its own build backend from kernels/python, so its dist-info carries the
    sglang.srt.plugins entry point SGLang discovers; the fatbins put beside the package are packages.kernels'."""
    env = nix.json(f".#packages.{SYSTEM}.sglang-env", "--apply", """e: let k = e.kernelsPackage; in {
      deps = e.NIX_PYPROJECT_DEPS; out = k.outPath; inherit (k) pname preBuild;
      fatbins = k.kernels.drvPath; fatbinsOut = k.kernels.outPath;
      tools = map (p: p.pname or p.name) k.nativeBuildInputs;
      pyproject = builtins.fromTOML (builtins.readFile "${k.src}/pyproject.toml");
      plugin = builtins.pathExists "${k.src}/pdserve_kernels/sglang_plugin/__init__.py"; }""")
    assert env["out"] in env["deps"].split(":"), "the kernels distribution is not in the environment"
    assert env["pname"] == "pdserve-kernels" and env["plugin"]
    project = env["pyproject"]
    assert project["project"]["entry-points"]["sglang.srt.plugins"] == {
        "pdserve_kernels": "pdserve_kernels.sglang_plugin:load"}
    # The backend the pyproject names builds it (its dist-info, entry_points.txt included), through pyproject.nix.
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert "setuptools" in env["tools"] and "pyproject-hook" in env["tools"], env["tools"]
    assert env["fatbins"] == nix.json(f".#packages.{SYSTEM}.kernels.drvPath")
    assert "for module in dsa_indexer sparse_mla_decode; do" in env["preBuild"]
    assert f"{env['fatbinsOut']}/share/pdserve-kernels/$file pdserve_kernels/$file" in env["preBuild"]
    assert set(project["tool"]["setuptools"]["package-data"]["pdserve_kernels"]) >= {"*.fatbin", "*.json"}


def test_the_sglang_env_is_the_pinned_serving_stack(nix: Evaluator):
    """The environment the units run (`python -m smg.launch_router`, SGLang, NIXL) has exactly the
    distributions pdserve is pinned to and checks at verify, and no sglang-router beside smg."""
    deps = nix.json(f".#packages.{SYSTEM}.sglang-env", "--apply", "e: e.NIX_PYPROJECT_DEPS").split(":")
    names = {re.sub(r"^/nix/store/[a-z0-9]{32}-", "", dep) for dep in deps}
    assert {f"{ROUTER_DISTRIBUTION}-{ROUTER_VERSION}", f"sglang-{SGLANG_VERSION}",
            f"{NIXL_DISTRIBUTION}-{NIXL_VERSION}"} <= names, sorted(names)
    assert not [name for name in names if name.startswith("sglang-router")], sorted(names)


def test_the_vm_test_node_evaluates_without_warnings(nix: Evaluator):
    node = nix.json(f".#checks.{SYSTEM}.vm-test", "--apply", """t: let m = t.nodes.machine; in {
      toplevel = m.system.build.toplevel.drvPath; inherit (m) warnings;
      configFile = m.services.pdserve.deployments.dsv4.configFile.drvPath;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) m.assertions);
      driver = t.driver.drvPath; }""")
    assert node["warnings"] == [] and node["failed"] == []
    assert node["toplevel"].endswith(".drv") and node["driver"].endswith(".drv")
    # Its stand-in sglangPackage has no SGLang: the build-time check runs without the parsers there only.
    assert "--no-parsers" in check_command(nix, node["configFile"])


def check_command(nix: Evaluator, config_file_drv: str) -> str:
    """The build command of the pdserve-deployments-check derivation behind a deployment's configFile."""
    drvs = json.loads(nix.run("derivation", "show", "-r", config_file_drv).stdout)
    (check,) = [d for path, d in drvs.items() if path.endswith("-pdserve-deployments-check.drv")]
    return check["env"]["buildCommand"]


# --- the gpu-host -----------------------------------------------------------------------------------

def test_gpu_host_evaluates_without_warnings_or_failed_assertions(cases):
    assert cases["host"]["failed"] == [] and cases["host"]["warnings"] == []
    assert re.fullmatch(r"/nix/store/[a-z0-9]{32}-nixos-system-gpu-host-.+\.drv", cases["host"]["toplevel"])
    assert set(cases["host"]["unitDrvs"]) == {"sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router",
                                              "sglang-dsv4"}
    for unit, drv in cases["host"]["unitDrvs"].items():
        assert re.fullmatch(rf"/nix/store/[a-z0-9]{{32}}-unit-{unit}\.service\.drv", drv), drv


def test_gpu_host_is_the_reference_hardware(cases):
    nvidia = cases["nvidia"]
    assert nvidia["driver"] == nvidia["productionDriver"]
    assert nvidia["open"] is True and nvidia["datacenter"] is False and nvidia["fabricmanager"] is False
    assert nvidia["persistenced"] is True and nvidia["graphics"] is True
    assert nvidia["cudaCapabilities"] == ["12.0a"]


def test_gpu_host_settings_are_the_host_file_as_pdserve_reads_it(cases, tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(cases["host"]["settings"]["dsv4"]), encoding="utf-8")
    assert load(path).deployment == reference()


# --- boot layout -----------------------------------------------------------------------------------

PD_UNITS = {"sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"}


def wanted_at_boot(summary: dict[str, Any]) -> set[str]:
    return {unit for unit, targets in summary["wantedBy"].items() if "multi-user.target" in targets}


def test_pd_layout_boots_prefill_decode_and_router(cases):
    assert wanted_at_boot(cases["host"]) == PD_UNITS


def test_single_layout_boots_only_the_fallback(cases):
    assert wanted_at_boot(cases["single"]) == {"sglang-dsv4"}
    assert cases["single"]["failed"] == [] and cases["single"]["warnings"] == []


# --- firewall and the API key ------------------------------------------------------------------------

def test_open_firewall_opens_the_router_port_and_nothing_else(cases):
    opened = set(cases["openFirewall"]["allowedTCPPorts"]) - set(cases["host"]["allowedTCPPorts"])
    assert opened == {reference().router.port}
    assert cases["openFirewall"]["failed"] == [] and cases["openFirewall"]["warnings"] == []


def test_api_key_file_is_a_path_outside_the_store_and_becomes_load_credential(cases, key_file, tmp_path):
    path, _ = key_file
    settings = cases["openFirewall"]["settings"]["dsv4"]
    assert settings["router"]["api_key_file"] == str(path) and not str(path).startswith("/nix/store")
    # The units are what pdserve renders from exactly these settings (the module's renderedUnits).
    dep = deployment_from_data(settings, "<evaluated settings>").deployment
    tools = Toolchain("/bin/python", "/bin/numactl", "/bin/pdserve", "/lib/keyed_launch.py")
    router = next(u for u in render_units(dep, tools, "/etc/pdserve.json")
                  if u.filename == "sglang-dsv4-router.service")
    assert re.search(rf"^LoadCredential=\S+:{re.escape(str(path))}$", router.text, re.M), router.text


def test_the_key_never_reaches_the_store(nix: Evaluator, cases, key_file):
    path, marker = key_file
    closure = nix.run("derivation", "show", "-r", cases["openFirewall"]["toplevel"]).stdout
    assert path.name in closure  # the scan sees the settings: the path is there, as a string
    assert marker not in closure
    sources = {source for drv in json.loads(closure).values() for source in drv.get("inputSrcs", [])}
    assert not [s for s in sources if s.endswith(path.name)], "the key file was copied into the store"


# --- assertions ---------------------------------------------------------------------------------------

def only_failure(summary: dict[str, Any]) -> str:
    assert len(summary["failed"]) == 1, summary["failed"]
    return " ".join(summary["failed"][0].split())


def test_open_firewall_on_a_loopback_router_fails_with_the_line_to_write(cases):
    message = only_failure(cases["openFirewallOnLoopback"])
    assert 'Write services.pdserve.deployments.dsv4.settings.router.host = "0.0.0.0";' in message


@pytest.mark.parametrize("router_host", EVAL_HOSTS)
def test_open_firewall_refuses_exactly_the_routers_pdserve_calls_loopback(cases, router_host):
    failed = cases["loopback"][router_host]
    if is_loopback(router_host):
        assert f"but the router listens on {router_host} only" in " ".join(only_failure({"failed": failed}).split())
    else:
        assert failed == [], failed


def test_the_module_adds_no_sandbox_to_the_rendered_units(cases):
    """The sandbox is the rendered units' (pdserve.render.hardening), the same on every host: a
    module drop-in for one of its keys would make NixOS units differ from what was scored."""
    keys = {key for role in ("prefill", "router") for key, _ in sandbox(role)}
    added = {unit: sorted(keys & set(names)) for unit, names in cases["host"]["serviceConfig"].items()}
    assert added == {unit: [] for unit in added} and len(added) == 4, added


def test_the_servers_path_keeps_the_sglang_environment_first_and_has_numactl(cases):
    """NixOS's PATH replaces the rendered units' Environment=PATH: its first entry must still be the one
    pdserve renders for the module's SGLang Python (FlashInfer runs that directory's ninja), and numactl,
    which SGLang looks up on PATH to bind its schedulers, must be there; the router gets neither."""
    host = cases["host"]
    dep = deployment_from_data(host["settings"]["dsv4"], "<evaluated settings>").deployment
    tools = Toolchain(f"{host['sglangPackage']}/bin/python", "/bin/numactl", "/bin/pdserve", "/lib/keyed_launch.py")
    for unit in render_units(dep, tools, "/etc/pdserve.json"):
        name = unit.filename.removesuffix(".service")
        path = host["path"][name].split(":")
        rendered = re.search(r'^Environment="PATH=([^:"]+)', unit.text, re.M)
        if name == "sglang-dsv4-router":
            assert rendered is None and not {f"{host['sglangPackage']}/bin", f"{host['numactl']}/bin"} & set(path)
        else:
            assert rendered and path[0] == rendered[1] == f"{host['sglangPackage']}/bin", (name, path)
            assert f"{host['numactl']}/bin" in path, (name, path)


def test_open_firewall_without_a_key_fails_with_the_line_to_write(cases):
    message = only_failure(cases["openFirewallWithoutKey"])
    assert 'Write services.pdserve.deployments.dsv4.apiKeyFile = "/run/keys/pdserve-api-key";' in message


def test_public_router_without_firewall_or_key_warns(cases):
    assert cases["publicWithoutKey"]["failed"] == []
    (warning,) = cases["publicWithoutKey"]["warnings"]
    assert "Set services.pdserve.deployments.dsv4.apiKeyFile." in " ".join(warning.split())


def test_relative_key_path_fails_with_the_line_to_write(cases):
    message = only_failure(cases["relativeKey"])
    assert 'apiKeyFile = "keys/pdserve-api-key" is not an absolute path' in message
    assert 'e.g. services.pdserve.deployments.dsv4.apiKeyFile = "/run/keys/pdserve-api-key";' in message


def test_key_file_in_the_store_fails(cases):
    assert "is in the Nix store, which every user can read" in only_failure(cases["storeKey"])


def test_two_deployments_on_distinct_listeners_pass(cases):
    assert cases["twoDeployments"]["failed"] == [] and cases["twoDeployments"]["warnings"] == []


@pytest.mark.parametrize("field", LISTENER_FIELDS)
def test_each_listener_collision_fails_with_the_line_to_write(cases, field):
    port = getattr(getattr(reference(), field.split(".")[0]), field.split(".")[1])
    message = only_failure({"failed": cases["collisions"][field]})
    assert f"services.pdserve.deployments.other.settings.{field} = {port} is also deployments.dsv4.settings.{field}" \
        in message
    assert re.search(rf"Write services\.pdserve\.deployments\.other\.settings\.{re.escape(field)} = \d+;", message)


def test_a_fallback_port_collision_fails(cases):
    assert ("deployments.other.settings.fallback.port = 30002 is also deployments.dsv4.settings.decode.port"
            in only_failure(cases["fallbackCollision"]))


@pytest.mark.parametrize(("case", "unit"), [("sameName", "sglang-dsv4-decode"),
                                            ("unitNameOfAnother", "sglang-dsv4-prefill")])
def test_unit_name_collisions_fail_with_the_line_to_write(cases, case, unit):
    message = only_failure(cases[case])
    assert f"both have the unit {unit}.service" in message
    assert 'Write services.pdserve.deployments.other.settings.name = "other2";' in message


def test_a_failed_assertion_stops_the_system_evaluation(nix: Evaluator, key_file):
    path, _ = key_file
    result = nix.run(
        "eval", "--impure", ".#nixosConfigurations.gpu-host", "--apply",
        f"host: (import {CASES} {{ inherit host; keyFile = {json.dumps(str(path))}; listenerFields = []; }})"
        ".openFirewallWithoutKey.toplevel",
        expect_ok=False,
    )
    assert result.returncode != 0
    assert "Failed assertions:" in result.stderr and "publishes the router on port 30001" in result.stderr


# --- build-time check and defaults -------------------------------------------------------------------

def test_one_build_time_check_of_all_deployments_with_the_real_parsers(nix: Evaluator, cases):
    command = check_command(nix, cases["twoDeployments"]["configFiles"]["other"])
    assert "pdserve check --json --no-host --sglang-python /nix/store/" in command
    assert "-pdserve-sglang-env/bin/python" in command and "--no-parsers" not in command
    files = re.findall(r"/nix/store/\S+-pdserve-(\S+)-settings\.json", command)
    assert sorted(files) == ["dsv4", "other"], command


def test_module_defaults_are_pdserves(cases, tmp_path):
    """A deployment that leaves out every optional key gets, from the module, exactly pdserve's defaults."""
    bare = cases["bare"]
    defaults = Deployment.model_fields
    for section, keys in {"router": ("host", "port", "prometheus_port"), "transfer": ("bootstrap_port",),
                          "systemd": ("user", "group", "wanted_by")}.items():
        model = defaults[section].default_factory()  # type: ignore[misc]
        for key in keys:
            assert bare[section][key] == getattr(model, key), f"{section}.{key}"
    assert bare["boot_layout"] == defaults["boot_layout"].default
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(bare), encoding="utf-8")
    assert load(path).deployment.router == defaults["router"].default_factory()  # type: ignore[misc]


# --- monitoring: services.prometheus and services.grafana ------------------------------------------

MONITORING_OFF = ["monitoringWithoutServices", "servicesWithoutMonitoring", "monitoringWiringOff"]


def deployments_of(summary: dict[str, Any]) -> list[Deployment]:
    """The evaluated settings as pdserve reads them, in the module's order (attribute names)."""
    return [deployment_from_data(settings, f"<evaluated {name}>").deployment
            for name, settings in sorted(summary["settings"].items())]


def units_out(summary: dict[str, Any], name: str) -> str:
    (out,) = [u["out"] for u in summary["renderedUnits"] if u["name"] == f"pdserve-{name}-units"]
    return out


def units_build_command(nix: Evaluator, summary: dict[str, Any], name: str) -> str:
    (drv,) = [u["drvPath"] for u in summary["renderedUnits"] if u["name"] == f"pdserve-{name}-units"]
    (units,) = json.loads(nix.run("derivation", "show", drv).stdout).values()
    return units["env"]["buildCommand"]


@pytest.mark.parametrize("case", ["monitoring", "monitoringTwo"])
def test_monitoring_on_evaluates_without_warnings_or_failed_assertions(cases, case):
    summary = cases[case]
    assert summary["failed"] == [] and summary["warnings"] == []
    # The whole system, Prometheus' checked configuration included, evaluates without reading a build.
    assert re.fullmatch(r"/nix/store/[a-z0-9]{32}-nixos-system-gpu-host-.+\.drv", summary["toplevel"])


@pytest.mark.parametrize("case", ["monitoring", "monitoringTwo"])
def test_monitoring_adds_the_rendered_alert_rules_to_prometheus(cases, case):
    summary = cases[case]
    names = [dep.name for dep in deployments_of(summary)]
    assert summary["ruleFiles"] == [f"{units_out(summary, n)}/share/pdserve/monitoring/alerts.yml" for n in names]


@pytest.mark.parametrize("case", ["monitoring", "monitoringTwo"])
def test_monitoring_scrape_jobs_are_what_pdserve_renders(cases, case):
    """services.prometheus.scrapeConfigs (nixpkgs' unset fields left out) is Python's scrape_configs of
    each monitored deployment: job names, targets, labels, interval and timeout."""
    summary = cases[case]
    expected = [job for dep in deployments_of(summary) for job in scrape_configs(dep)]
    assert summary["scrapeConfigs"] == expected
    if case == "monitoringTwo":  # the variant with IPv6 listeners and a 5 s interval
        targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in expected}
        assert targets["pdserve-other-router"] == ["[::1]:29002"]
        assert targets["pdserve-other-fallback"] == ["[::1]:31003"]
        assert {job["scrape_timeout"] for job in expected if "other" in job["job_name"]} == {"5s"}


@pytest.mark.parametrize("case", ["monitoring", "monitoringTwo"])
def test_monitoring_provisions_the_dashboards_and_a_prometheus_datasource_in_grafana(cases, case):
    summary = cases[case]
    grafana = summary["grafana"]
    deps = deployments_of(summary)
    assert grafana["enable"] is True
    assert grafana["dashboards"]["providers"] == [
        {"name": f"pdserve-{dep.name}", "type": "file",
         "options": {"path": f"{units_out(summary, dep.name)}/share/pdserve/monitoring/dashboards"}}
        for dep in deps
    ]
    (source,) = grafana["datasources"]["datasources"]
    assert (source["name"], source["url"], source["access"]) == ("pdserve Prometheus", "http://127.0.0.1:9090", "proxy")
    # The dashboards choose their data source through a variable of this type.
    for dep in deps:
        (variable,) = dashboard(dep)["templating"]["list"]
        assert (variable["type"], variable["query"]) == ("datasource", source["type"])


def test_the_rendered_units_install_every_monitoring_file(nix: Evaluator, cases, tmp_path):
    """The install lines of the units derivation, run (with bash, as its builder would) on what `pdserve
    render` writes for the evaluated settings: every monitoring file lands under share/pdserve/monitoring,
    the dashboard alone in dashboards/ (Grafana's file provider reads every *.json there)."""
    summary = cases["monitoring"]
    command = units_build_command(nix, summary, "dsv4")
    install = command[command.index("mkdir -p $out/lib/systemd/system"):]
    assert "/nix/store/" not in install, install
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(summary["settings"]["dsv4"]), encoding="utf-8")
    work, out = tmp_path / "build", tmp_path / "out"
    work.mkdir()
    rendered = subprocess.run(
        [sys.executable, "-m", "pdserve.cli.main", "render", "-c", str(settings), "--out", str(work / "units"),
         "--sglang-python", sys.executable, "--numactl", "/bin/true", "--pdserve", "/bin/true"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", install], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "TMPDIR": str(work), "out": str(out)})
    assert ran.returncode == 0, ran.stderr
    installed = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    monitoring = [p for p in installed if p.startswith("share/pdserve/monitoring/")]
    assert monitoring == [f"share/pdserve/monitoring/{name}" for name in (
        "alerts.yml", "dashboards/pdserve-dsv4.json", "prometheus-scrape.yml", "prometheus.yml")]
    assert not list((work / "units").rglob("*.*")), "something pdserve rendered was left behind"
    files = monitoring_files(deployments_of(summary)[0])
    assert (out / "share/pdserve/monitoring/alerts.yml").read_text(encoding="utf-8") == files[ALERTS_FILE]
    assert (out / "share/pdserve/monitoring/dashboards/pdserve-dsv4.json").read_text(encoding="utf-8") \
        == files[DASHBOARD_FILE]


@pytest.mark.parametrize("case", MONITORING_OFF)
def test_without_monitoring_or_the_services_nothing_is_wired(nix: Evaluator, cases, case):
    """Monitoring on without Prometheus or Grafana on the host; both on without monitoring; both on
    with the module's wiring turned off: no rule file, no scrape job, no Grafana provisioning."""
    summary = cases[case]
    assert summary["failed"] == [] and summary["warnings"] == []
    assert summary["ruleFiles"] == [] and summary["scrapeConfigs"] == []
    assert summary["grafana"] == {"enable": False, "dashboards": None, "datasources": None}
    if case == "servicesWithoutMonitoring":
        assert "monitoring" not in units_build_command(nix, summary, "dsv4")


def test_wiring_asked_for_without_the_services_warns(cases):
    summary = cases["monitoringWiringWithoutServices"]
    assert summary["failed"] == []
    warnings = sorted(" ".join(w.split()) for w in summary["warnings"])
    assert len(warnings) == 2, warnings
    assert "Write services.grafana.enable = true;" in warnings[0]
    assert "Write services.prometheus.enable = true;" in warnings[1]
    # No Prometheus here, so no data source either: the dashboards' variable offers what Grafana has.
    assert summary["grafana"]["datasources"]["datasources"] == []


def test_grafana_provisioned_from_the_users_files_gets_a_warning_not_a_failure(cases):
    """nixpkgs refuses provision.*.settings beside provision.*.path; the module then adds nothing to
    Grafana and says what to add to the user's files. Prometheus is wired as before."""
    summary = cases["grafanaProvisionedByFiles"]
    assert summary["failed"] == []
    assert summary["grafana"]["dashboards"] is None and summary["grafana"]["datasources"] is None
    warnings = sorted(" ".join(w.split()) for w in summary["warnings"])
    assert len(warnings) == 2, warnings
    assert "provision.dashboards.path is set, so the pdserve dashboards are not provisioned" in warnings[0]
    assert "/share/pdserve/monitoring/dashboards" in warnings[0] and '"name":"pdserve-dsv4"' in warnings[0]
    assert "provision.datasources.path is set" in warnings[1] and "datasourceUrl = null;" in warnings[1]
    assert [job["job_name"] for job in summary["scrapeConfigs"]] == [
        f"pdserve-dsv4-{role}" for role in ("prefill", "decode", "router", "fallback")]
