# services.pdserve: a thin adapter from NixOS options to `pdserve`. The deployment schema, its rules and
# the unit files all live in the Python package; the module writes the settings as JSON, has
# `pdserve check` validate them (with SGLang's real parsers, and all deployments of the host together)
# while the system builds, has `pdserve render` write the units, ships those with systemd.packages, and
# adds what only NixOS knows: store paths, users, firewall, credentials, boot wiring, driver libraries.
#
# This file holds the options and what applies to the host as a whole. One concern per imported file:
#   deployment.nix   the options of one deployment (services.pdserve.deployments.<name>)
#   units.nix        build-time check, rendered units, systemd wiring
#   assertions.nix   what must name an option: collisions across deployments, openFirewall, apiKeyFile
#   firewall.nix     the router's port and the multi-host worker ports (rules: firewall-rules.nix)
#   monitoring.nix   scrape jobs, alert rules and dashboards into the host's Prometheus and Grafana
# What the module needs of pdserve's computation comes from pdserve as data (derived.nix reads
# from-python.json, which pdserve writes; defaults come from pdserve's committed JSON Schema).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;
  inherit (import ./common.nix { inherit config lib; })
    cfg
    derived
    schema
    deployments
    ;
  users = lib.unique (map (d: d.settings.systemd.user) deployments);
  groups = lib.unique (map (d: d.settings.systemd.group) deployments);
in
{
  imports = [
    ./units.nix
    ./assertions.nix
    ./firewall.nix
    ./monitoring.nix
  ];

  options.services.pdserve = {
    enable = lib.mkEnableOption "pdserve: SGLang prefill/decode disaggregated serving behind the smg router";

    package = lib.mkPackageOption pkgs "pdserve" {
      extraDescription = ''
        It renders and validates the units and runs their readiness gates. pdserve's flake adds it
        to `pkgs` through `overlays.default`; without that overlay set this option to
        `pdserve.packages.x86_64-linux.pdserve`.
      '';
    };

    sglangPackage = lib.mkPackageOption pkgs "pdserve-sglang-env" {
      extraDescription = ''
        An environment whose `bin/python` has sglang, smg (the router) and NIXL (pdserve's flake builds
        it from pkg/sglang-env/uv.lock: `pdserve.packages.x86_64-linux.sglang-env`). Kept apart from
        `package` so torch never enters the orchestrator's closure.
      '';
    };

    host = mkOption {
      type = types.str;
      default = config.networking.hostName;
      defaultText = literalExpression "config.networking.hostName";
      example = "node-a";
      description = ''
        This machine's name among the `[hosts]` of the multi-host deployments: of each, only the units
        placed on it are installed (`pdserve render --host`), and the firewall opens their ports to the
        hosts that must reach them and to no other. Single-host deployments (no `[hosts]`) ignore it.
      '';
    };

    openToPeers = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Multi-host deployments: accept every other connection from the deployment's other hosts (their
        cluster addresses): SGLang's KV side channel (random ports on every rank), NCCL's and UCX's sockets
        between nodes and roles. Their worker ports stay open only to the hosts that use them, and hosts
        outside the deployment reach nothing but what the firewall allows otherwise. false: open what
        the transfer backend and NCCL need yourself (networking.firewall).
      '';
    };

    checkParsers = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Run every rendered command line through the argument parsers of `sglangPackage`'s SGLang and
        router (smg) while the system builds (a parser that cannot run fails the build), as the
        Prometheus module runs promtool. Turn off only for an `sglangPackage` without SGLang, such as
        the stand-in of pdserve's VM test; schema, rules and the checks across deployments still run.
      '';
    };

    createUsers = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Create the system users and groups named in each deployment's `settings.systemd.user` and
        `settings.systemd.group`. Turn off to manage them yourself.
      '';
    };

    monitoring = {
      prometheus.enable = mkOption {
        type = types.bool;
        default = config.services.prometheus.enable;
        defaultText = literalExpression "config.services.prometheus.enable";
        description = ''
          For every deployment whose `settings.monitoring.enable` is true, add its scrape jobs (one
          per role, `pdserve-<name>-<role>`, with `deployment` and `role` labels) to
          `services.prometheus.scrapeConfigs` and its rendered alert rules to
          `services.prometheus.ruleFiles`. On by default where this host runs Prometheus; this does
          not turn Prometheus on (`services.prometheus.enable`). Turn off when another host scrapes
          these deployments: it takes the rendered `share/pdserve/monitoring/prometheus-scrape.yml`.
        '';
      };
      grafana = {
        enable = mkOption {
          type = types.bool;
          default = config.services.grafana.enable;
          defaultText = literalExpression "config.services.grafana.enable";
          description = ''
            For every deployment whose `settings.monitoring.enable` is true, provision its dashboard in
            `services.grafana` (a file provider reading the rendered dashboard directory) and, with
            `datasourceUrl` set, a Prometheus data source. On by default where this host runs Grafana;
            this does not turn Grafana on (`services.grafana.enable`).
          '';
        };
        datasourceUrl = mkOption {
          type = types.nullOr types.str;
          default =
            if config.services.prometheus.enable then
              "http://${derived.connectHost config.services.prometheus.listenAddress}:${toString config.services.prometheus.port}"
            else
              null;
          defaultText = literalExpression ''
            "http://127.0.0.1:''${toString config.services.prometheus.port}" where this host runs Prometheus, else null
          '';
          example = "http://prometheus.internal:9090";
          description = ''
            URL of the Prometheus Grafana reads, provisioned as the data source "pdserve Prometheus".
            null provisions none: the dashboards' `datasource` variable then offers the Prometheus
            data sources Grafana already has.
          '';
        };
      };
    };

    deployments = mkOption {
      type = types.attrsOf (types.submodule (import ./deployment.nix { inherit lib pkgs schema; }));
      default = { };
      example = literalExpression ''
        {
          dsv4.settings = builtins.fromTOML (builtins.readFile ./deployment.toml);
          dsv4.apiKeyFile = "/run/keys/pdserve-api-key";
        }
      '';
      description = ''
        PD deployments: each gets prefill, decode and router units and a single-server fallback
        unit, all installed; `settings.boot_layout` decides which start at boot (by default the
        PD units).
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.deployments != { };
        message = ''
          services.pdserve is enabled without a deployment. Add one, e.g.
            services.pdserve.deployments.dsv4.settings = builtins.fromTOML (builtins.readFile ./deployment.toml);
        '';
      }
    ];

    warnings = lib.optional (!config.hardware.graphics.enable) ''
      services.pdserve: hardware.graphics.enable is false, so /run/opengl-driver/lib (where the
      SGLang environment looks for libcuda) stays empty. On a GPU host write
      hardware.graphics.enable = true; together with the hardware.nvidia settings.
    '';

    # The SGLang environment finds libcuda and libnvidia-ml in /run/opengl-driver/lib, which only
    # hardware.graphics populates (nixpkgs: "should be enabled by the corresponding modules").
    hardware.graphics.enable = lib.mkDefault true;

    environment.systemPackages = [ cfg.package ];

    users.users = lib.mkIf cfg.createUsers (
      lib.genAttrs users (user: {
        isSystemUser = true;
        # The first deployment that names this user decides its primary group.
        group = (lib.findFirst (d: d.settings.systemd.user == user) null deployments).settings.systemd.group;
        description = "pdserve SGLang servers and router";
      })
    );
    users.groups = lib.mkIf cfg.createUsers (lib.genAttrs groups (_: { }));
  };
}
