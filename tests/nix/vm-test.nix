# NixOS VM test of services.pdserve (a flake check; needs KVM, no GPU). The reference deployment
# runs for real under systemd: the units the module renders, its drop-ins, the real router (smg
# 1.13.0) in PD mode, and the stand-in SGLang worker (tests/fixtures/standin_sglang, a test fixture)
# behind `python -m sglang.launch_server`. `pdserve cutover` runs both ways on NixOS's generated,
# read-only boot links. Evaluated (tests/nix/test_eval.py); never run yet (needs a binary cache).
{
  pkgs,
  lib,
  # pdserve itself, and a Python environment holding the router (smg) and its dependencies (no torch).
  pdserve,
  routerEnv,
}:
let
  fixtures = lib.fileset.toSource {
    root = ../fixtures;
    fileset = ../fixtures/standin_sglang;
  };

  # What the module's `sglangPackage` must provide: bin/python that runs `-m sglang.launch_server`
  # (here the stand-in, through the fixture's own shim) and `-m smg.launch_router`.
  standinSglang =
    pkgs.runCommand "pdserve-standin-sglang"
      {
        nativeBuildInputs = [ pkgs.makeWrapper ];
      }
      ''
        mkdir -p $out/bin
        ${routerEnv}/bin/python -c 'import sys; sys.path.insert(0, sys.argv[1]); from standin_sglang import make_shim; make_shim(sys.argv[2])' \
          ${fixtures} $out/shim
        makeWrapper ${routerEnv}/bin/python $out/bin/python --prefix PYTHONPATH : $out/shim
      '';

  reference = builtins.fromTOML (builtins.readFile ../../hosts/gpu-host/deployment.toml);

  # The VM has one NUMA node and no GPU: drop the NUMA binding (numactl --membind=1 would fail);
  # the stand-in accepts the GPU placement flags without GPUs.
  settings = lib.recursiveUpdate reference {
    prefill.numa_node = null;
    decode.numa_node = null;
  };

  chatRequest = builtins.toJSON {
    model = reference.model.served_name;
    messages = [
      {
        role = "user";
        content = "Say hello.";
      }
    ];
    max_tokens = 16;
  };
in
pkgs.testers.runNixOSTest {
  name = "pdserve-module";

  nodes.machine = {
    imports = [ ../../nixos-modules/pdserve.nix ];

    virtualisation.memorySize = 2048;
    virtualisation.cores = 2;

    services.pdserve = {
      enable = true;
      package = pdserve;
      sglangPackage = standinSglang;
      # The stand-in environment has the router (smg) but not SGLang, whose parser needs torch.
      checkParsers = false;
      deployments.dsv4 = {
        inherit settings;
        apiKeyFile = "/run/pdserve-test/api-key";
      };
    };

    systemd.tmpfiles.rules = [
      "d ${reference.model.path} 0755 root root -"
      "d /run/pdserve-test 0700 root root -"
      "f /run/pdserve-test/api-key 0400 root root - test-key"
    ];

    environment.etc."pdserve-test/chat.json".text = chatRequest;
    environment.systemPackages = [ pkgs.curl ];
  };

  testScript =
    { nodes, ... }:
    let
      configFile = nodes.machine.services.pdserve.deployments.dsv4.configFile;
    in
    ''
    import json

    machine.wait_for_unit("multi-user.target")
    # After= means ready: the router starts only once both workers' readiness gates have passed.
    machine.wait_for_unit("sglang-dsv4-router.service", timeout=600)

    with subtest("PD units start at boot, the fallback is installed but not wanted"):
        for unit in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"):
            machine.succeed(f"test -e /etc/systemd/system/multi-user.target.wants/{unit}.service")
            machine.succeed(f"systemctl is-active {unit}.service")
        machine.succeed("test -e /etc/systemd/system/sglang-dsv4.service")
        machine.fail("test -e /etc/systemd/system/multi-user.target.wants/sglang-dsv4.service")
        machine.fail("systemctl is-active sglang-dsv4.service")

    with subtest("the router registered both workers"):
        ready = json.loads(machine.succeed("curl -sf http://127.0.0.1:30001/readiness"))
        assert ready.get("healthy_workers") == 2, ready

    with subtest("the API key from apiKeyFile is enforced through LoadCredential"):
        status = machine.succeed(
            "curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' "
            "-d @/etc/pdserve-test/chat.json http://127.0.0.1:30001/v1/chat/completions"
        )
        assert status.strip() == "401", status
        reply = json.loads(machine.succeed(
            "curl -sf -H 'authorization: Bearer test-key' -H 'content-type: application/json' "
            "-d @/etc/pdserve-test/chat.json http://127.0.0.1:30001/v1/chat/completions"
        ))
        assert reply["choices"][0]["message"]["content"], reply
        machine.fail("grep -r test-key /etc/systemd/system/sglang-dsv4-router.service")

    with subtest("workers listen on loopback only"):
        for port in (30000, 30002):
            listeners = machine.succeed(f"ss -ltnH 'sport = :{port}'")
            assert listeners.strip(), f"nothing listens on {port}"
            assert all("127.0.0.1:" in line for line in listeners.strip().splitlines()), listeners

    with subtest("the rendered sandbox applies, with the GPU relaxations on the servers only"):
        show = lambda unit, prop: machine.succeed(f"systemctl show -P {prop} {unit}.service").strip()
        assert show("sglang-dsv4-prefill", "ProtectSystem") == "strict"
        assert show("sglang-dsv4-prefill", "DevicePolicy") == "closed"
        assert show("sglang-dsv4-prefill", "PrivateDevices") == "no"
        assert show("sglang-dsv4-router", "PrivateDevices") == "yes"
        assert show("sglang-dsv4-prefill", "User") == "pdserve"

    with subtest("a killed worker comes back (Restart=on-failure)"):
        pid = machine.succeed("systemctl show -P MainPID sglang-dsv4-decode.service").strip()
        machine.succeed(f"kill -9 {pid}")
        machine.wait_until_succeeds(
            "test \"$(systemctl show -P MainPID sglang-dsv4-decode.service)\" != " + pid
            + " && systemctl is-active sglang-dsv4-decode.service",
            timeout=120,
        )

    chat = (
        "curl -sf -H 'authorization: Bearer test-key' -H 'content-type: application/json' "
        "-d @/etc/pdserve-test/chat.json http://127.0.0.1:30001/v1/chat/completions"
    )
    wants = "/etc/systemd/system/multi-user.target.wants"

    with subtest("cutover to the single layout serves on the same URL; NixOS's boot links stay as declared"):
        machine.wait_until_succeeds("systemctl is-active sglang-dsv4-router.service", timeout=120)
        report = json.loads(machine.succeed("pdserve cutover single --json -c ${configFile}"))
        machine.succeed("systemctl is-active sglang-dsv4.service")
        for unit in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"):
            machine.fail(f"systemctl is-active {unit}.service")
        assert json.loads(machine.succeed(chat))["choices"][0]["message"]["content"]
        # The wants links are the store's: boot_layout decides them, the cutover only says what to write.
        machine.succeed(f"test -e {wants}/sglang-dsv4-router.service")
        machine.fail(f"test -e {wants}/sglang-dsv4.service")
        assert 'settings.boot_layout = "single";' in json.dumps(report), report

    with subtest("cutover back to pd"):
        machine.succeed("pdserve cutover pd --json -c ${configFile}")
        machine.fail("systemctl is-active sglang-dsv4.service")
        for unit in ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router"):
            machine.succeed(f"systemctl is-active {unit}.service")
        assert json.loads(machine.succeed(chat))["choices"][0]["message"]["content"]
    '';
}
