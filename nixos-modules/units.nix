# The units of services.pdserve: every deployment's settings written as JSON and checked by one build-time
# `pdserve check` of them all (as nixpkgs' Prometheus module runs promtool), its units rendered by
# `pdserve render` and shipped with systemd.packages, and what only NixOS knows added to them: boot
# wiring (wantedBy), the driver library path, PATH. The units' sandbox is rendered with them
# (pdserve.render.hardening), the same on every host; nothing here adds to it.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (import ./common.nix { inherit config lib; })
    cfg
    deployments
    multiHost
    hostUnitsOf
    isMonitored
    monitoringDir
    dashboardDir
    ;
  json = pkgs.formats.json { };

  settingsJson = d: json.generate "pdserve-${d.settings.name}-settings.json" d.settings;

  # Each deployment on its own (schema, field rules, SGLang's and the router's real parsers from
  # sglangPackage, the environment the units run) and all together (no listener port or unit name twice
  # on the host). A problem fails the build with pdserve's own messages (field, bad value, fix). Host
  # checks (GPUs, NUMA nodes, files) need the real machine: `nix run .#verify` runs those there.
  checkedDeployments =
    pkgs.runCommand "pdserve-deployments-check"
      {
        nativeBuildInputs = [
          cfg.package
          pkgs.jq
        ];
      }
      ''
        export HOME=$TMPDIR
        status=0
        pdserve check --json --no-host ${
          if cfg.checkParsers then "--sglang-python ${cfg.sglangPackage}/bin/python" else "--no-parsers"
        } \
          ${lib.escapeShellArgs (map settingsJson deployments)} > report.json || status=$?
        jq -r '((.deployments // [.])[] | .problems[]), (.across // [])[]
          | "\(.severity): \(.field) = \(.value | tojson): \(.message); fix: \(.fix)"' report.json >&2
        [ "$status" = 0 ] || exit "$status"
        # Here a parser that cannot run is a failure, not a skip: sglangPackage is what the units run.
        if jq -e '[(.deployments // [.])[] | .skipped[] | select(test("parser check skipped|parser not importable"))]
                  | length > 0' report.json >&2; then
          echo "error: SGLang's parsers did not run with ${cfg.sglangPackage}/bin/python" >&2
          exit 1
        fi
        mv report.json $out
      '';

  renderedUnits =
    d:
    pkgs.runCommand "pdserve-${d.settings.name}-units"
      {
        nativeBuildInputs = [ cfg.package ];
      }
      (''
        pdserve render -c ${d.configFile} --out "$TMPDIR/units" \
          --config-path ${d.configFile}${lib.optionalString (multiHost d) " --host ${lib.escapeShellArg cfg.host}"} \
          --sglang-python ${cfg.sglangPackage}/bin/python \
          --numactl ${pkgs.numactl}/bin/numactl \
          --pdserve ${cfg.package}/bin/pdserve \
          --no-python-check
        # --no-python-check: checkedDeployments asks sglangPackage for its packages and parsers already
        # (where checkParsers is on; the VM test's stand-in Python has neither).
        mkdir -p $out/lib/systemd/system $out/share/pdserve
        mv "$TMPDIR"/units/*.service $out/lib/systemd/system/
        # The deployment with every default filled in, as the units see it: for reading, not loading.
        mv "$TMPDIR"/units/pdserve-*.json $out/share/pdserve/
      ''
      + lib.optionalString (multiHost d) ''
        # The host's nftables ruleset for hosts without NixOS; here networking.firewall has the same ports.
        mv "$TMPDIR"/units/pdserve-*-firewall.nft $out/share/pdserve/
      ''
      + lib.optionalString (isMonitored d) ''
        # settings.monitoring.enable: the scrape jobs, a whole prometheus.yml and the alert rules; the
        # dashboard in a directory of its own, which Grafana's file provider reads whole (*.json).
        mkdir -p $out/${monitoringDir} $out/${dashboardDir}
        mv "$TMPDIR"/units/monitoring/dashboard.json $out/${dashboardDir}/pdserve-${d.settings.name}.json
        mv "$TMPDIR"/units/monitoring/prometheus-scrape.yml "$TMPDIR"/units/monitoring/prometheus.yml \
          "$TMPDIR"/units/monitoring/alerts.yml $out/${monitoringDir}/
      '');

  # Servers (not the router) need the driver's libraries and SGLang's tools.
  worker = {
    environment = {
      # Triton finds libcuda.so.1 through `ldconfig -p`, which has no answer on NixOS; this is its
      # own knob for the driver's library directory.
      TRITON_LIBCUDA_PATH = "${pkgs.addDriverRunpath.driverLink}/lib";
    };
    # NixOS writes PATH for every service it declares, over the rendered unit's: keep what the unit
    # puts first, the SGLang env's bin (FlashInfer JIT-builds with the `ninja` there), and add numactl,
    # with which SGLang binds its scheduler processes to each GPU's NUMA node, looked up on PATH.
    path = [
      cfg.sglangPackage
      pkgs.numactl
    ];
  };

  # What starts at boot follows settings.boot_layout; NixOS generates the wants links from wantedBy
  # (the [Install] sections of the rendered units are not read here). The fallback is always
  # installed and wanted at boot only in the single layout (`pdserve cutover` switches now); a
  # multi-host file has no fallback, so all of its units are the PD layout's.
  unitsOf =
    d:
    lib.mapAttrs (
      _: role:
      lib.optionalAttrs (role != "router") worker
      // {
        wantedBy = lib.optional (
          d.settings.boot_layout == (if role == "fallback" then "single" else "pd")
        ) d.settings.systemd.wanted_by;
      }
    ) (hostUnitsOf d);
in
{
  # Each deployment's checked JSON and rendered units, for the other files of the module to read.
  options.services.pdserve.deployments = lib.mkOption {
    type = lib.types.attrsOf (
      lib.types.submodule (
        { config, ... }:
        {
          options.units = lib.mkOption {
            type = lib.types.package;
            readOnly = true;
            internal = true;
            description = "The units `pdserve render` writes for this deployment on this host, and its monitoring files.";
          };
          config = {
            configFile = pkgs.runCommand "pdserve-${config.settings.name}.json" { } ''
              # Valid on its own and beside every other deployment of this host: ${checkedDeployments}
              ln -s ${settingsJson config} $out
            '';
            units = renderedUnits config;
          };
        }
      )
    );
  };

  config = lib.mkIf cfg.enable {
    # A multi-host deployment that places nothing here has nothing to install (a warning says so).
    systemd.packages = map (d: d.units) (lib.filter (d: hostUnitsOf d != { }) deployments);
    systemd.services = lib.mkMerge (map unitsOf deployments);
  };
}
