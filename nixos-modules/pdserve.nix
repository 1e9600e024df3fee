# services.pdserve: a thin adapter from NixOS options to `pdserve`. The deployment schema, its rules
# and the unit files all live in the Python package; this module writes the settings as JSON, has
# `pdserve check` validate them (with SGLang's real parsers, and all deployments of the host together)
# while the system builds, has `pdserve render` write the units, ships those with systemd.packages,
# and adds what only NixOS knows: store paths, users, firewall, credentials, boot wiring, driver
# libraries. The units' sandbox is rendered with them (pdserve.render.hardening), not added here.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;

  cfg = config.services.pdserve;
  json = pkgs.formats.json { };

  # pdserve's committed JSON Schema (`pdserve schema`, a source file: no import-from-derivation) is
  # where this module takes every default it needs, so a deployment that leaves a key out means the
  # same to the module as to pdserve.
  schema = lib.importJSON ../pkg/pdserve/schema/deployment.schema.json;
  schemaDefault = section: key: schema."$defs".${section}.properties.${key}.default;
  bootLayouts = schema.properties.boot_layout.enum;

  # Loopback and unit names exactly as pdserve derives them (derived.nix; tests/nix holds both
  # against the Python functions).
  derived = import ./derived.nix;
  inherit (derived) isLoopback;
  # The module needs the unit names for wantedBy, the workers' environment and the collision check.
  unitNames = d: derived.unitNames d.settings.name;
  multiHost = d: derived.multiHost d.settings;
  # The units this machine runs of a deployment, unit name -> role: all four of a single-host file;
  # of a multi-host file those `pdserve render --host <services.pdserve.host>` writes.
  hostUnitsOf =
    d:
    if multiHost d then
      derived.hostUnits d.settings cfg.host
    else
      lib.mapAttrs' (role: unit: lib.nameValuePair unit role) (unitNames d);
  # Deployments whose settings turn monitoring on (`pdserve render` then writes DIR/monitoring/).
  # A multi-host deployment's scrape targets span hosts: the module wires monitoring of single-host ones.
  monitored = lib.filter (d: !multiHost d && derived.monitoringEnabled schema d.settings) deployments;

  portOption =
    section: key: description:
    mkOption {
      type = types.port;
      default = schemaDefault section key;
      defaultText = literalExpression "${toString (schemaDefault section key)} (pdserve's default)";
      inherit description;
    };

  # `[prefill]`: the one server of a single-host file (it listens on loopback); `[[prefill]]`: the
  # servers of a multi-host file, each placed on `hosts`. Only what the module reads is typed.
  serversOption =
    role: port:
    mkOption {
      type = types.either (types.submodule {
        freeformType = json.type;
        options.port = mkOption {
          type = types.port;
          example = port;
          description = "Port of the ${role} server (listens on loopback).";
        };
      }) (types.nonEmptyListOf (types.submodule {
        freeformType = json.type;
        options = {
          port = mkOption {
            type = types.port;
            example = port;
            description = "Port of this ${role} server (on its first host's cluster address).";
          };
          hosts = mkOption {
            type = types.nonEmptyListOf types.str;
            example = [ "node-a" ];
            description = "The `[hosts]` it runs on: one, or several for multi-node tensor parallelism.";
          };
        };
      }));
      description = "The ${role} server (a single-host file) or servers (`[[${role}]]` of a multi-host file).";
    };

  deploymentModule =
    { name, config, ... }:
    {
      options = {
        settings = mkOption {
          description = ''
            The deployment, exactly as `pdserve` reads it (`pdserve schema` prints every field; the
            reference is hosts/gpu-host/deployment.toml, which can be read in with
            `builtins.fromTOML (builtins.readFile ./deployment.toml)`). Written to the Nix store as
            JSON and checked with `pdserve check` while the system builds. It is world-readable:
            put secrets in files (see `apiKeyFile`), never here.
          '';
          example = literalExpression ''
            builtins.fromTOML (builtins.readFile ./deployment.toml)
          '';
          type = types.submodule {
            freeformType = json.type;
            # Only the keys this module reads are typed here; pdserve's schema types the rest.
            options = {
              name = mkOption {
                type = types.strMatching "[a-z0-9][a-z0-9-]{0,40}";
                default = name;
                defaultText = literalExpression "<the attribute name under services.pdserve.deployments>";
                description = "Unit names derive from it: sglang-<name>-prefill, -decode, -router and the fallback sglang-<name>.";
              };
              prefill = serversOption "prefill" 30000;
              decode = serversOption "decode" 30002;
              router = {
                host = mkOption {
                  type = types.str;
                  default = schemaDefault "RouterSpec" "host";
                  example = "0.0.0.0";
                  description = "Address the router (the only public endpoint) listens on.";
                };
                port = portOption "RouterSpec" "port" "Port of the router; `openFirewall` opens this one and no other.";
                prometheus_port = portOption "RouterSpec" "prometheus_port" "Port of the router's Prometheus metrics (stays closed in the firewall).";
              };
              transfer.bootstrap_port = portOption "TransferSpec" "bootstrap_port" "KV bootstrap port the prefill server binds; distinct per deployment.";
              systemd = {
                user = mkOption {
                  type = types.str;
                  default = schemaDefault "SystemdSpec" "user";
                  description = "User the SGLang servers and the router run as.";
                };
                group = mkOption {
                  type = types.str;
                  default = schemaDefault "SystemdSpec" "group";
                  description = "Group the SGLang servers and the router run as.";
                };
                wanted_by = mkOption {
                  type = types.str;
                  default = schemaDefault "SystemdSpec" "wanted_by";
                  description = "Target that pulls in the units of `boot_layout` at boot.";
                };
              };
              boot_layout = mkOption {
                type = types.enum bootLayouts;
                default = schema.properties.boot_layout.default;
                example = "single";
                description = ''
                  Which layout starts at boot: `"pd"` (prefill, decode and router wanted by
                  `systemd.wanted_by`) or `"single"` (only the fallback). `pdserve cutover` switches
                  what runs now; on NixOS it cannot change boot links (they are generated), so it
                  names this line to change, and the next `nixos-rebuild switch` makes it so.
                '';
              };
            };
          };
        };

        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Open the router's port (`settings.router.port`) in the firewall, and no other: prefill,
            decode, the bootstrap and the Prometheus ports stay closed (the workers bypass the
            router's API key). Requires a public `settings.router.host` and `apiKeyFile`.
          '';
        };

        apiKeyFile = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "/run/keys/pdserve-api-key";
          description = ''
            Absolute path of a file holding the API key clients must send to the router. It is
            outside the Nix store (a string, not a Nix path, so it is never copied there); the
            router reads it through systemd's `LoadCredential=`. Sets `settings.router.api_key_file`.
          '';
        };

        configFile = mkOption {
          type = types.package;
          readOnly = true;
          defaultText = literalExpression "<settings as JSON in the Nix store, checked by pdserve check>";
          description = ''
            The deployment as the units read it: `settings` written as JSON and validated at build
            time by one `pdserve check` of every deployment of the host, with the real parsers of
            `services.pdserve.sglangPackage`; `nix run .#verify` passes it to `pdserve verify -c`.
          '';
        };
      };

      config = {
        settings.router = lib.mkIf (config.apiKeyFile != null) {
          api_key_file = config.apiKeyFile;
        };
        configFile = pkgs.runCommand "pdserve-${config.settings.name}.json" { } ''
          # Valid on its own and beside every other deployment of this host: ${checkedDeployments}
          ln -s ${settingsJson config} $out
        '';
      };
    };

  deployments = lib.attrValues cfg.deployments;

  settingsJson = d: json.generate "pdserve-${d.settings.name}-settings.json" d.settings;

  # Build-time validation, as nixpkgs' Prometheus module runs promtool: one `pdserve check` of every
  # deployment, each on its own (schema, field rules, SGLang's and the router's real parsers from
  # sglangPackage, the environment the units run) and all together (no listener port or unit name
  # twice on the host). A problem fails the build with pdserve's own messages (field, bad value, fix).
  # Host checks (GPUs, NUMA nodes, files) need the real machine: `nix run .#verify` runs those there.
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
    let
      settingsFile = d.configFile;
    in
    pkgs.runCommand "pdserve-${d.settings.name}-units"
      {
        nativeBuildInputs = [ cfg.package ];
      }
      (''
        pdserve render -c ${settingsFile} --out "$TMPDIR/units" \
          --config-path ${settingsFile}${lib.optionalString (multiHost d) " --host ${lib.escapeShellArg cfg.host}"} \
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
      + lib.optionalString (!multiHost d && derived.monitoringEnabled schema d.settings) ''
        # settings.monitoring.enable: the scrape jobs, a whole prometheus.yml and the alert rules; the
        # dashboard in a directory of its own, which Grafana's file provider reads whole (*.json).
        mkdir -p $out/${monitoringDir} $out/${dashboardDir}
        mv "$TMPDIR"/units/monitoring/dashboard.json $out/${dashboardDir}/pdserve-${d.settings.name}.json
        mv "$TMPDIR"/units/monitoring/prometheus-scrape.yml "$TMPDIR"/units/monitoring/prometheus.yml \
          "$TMPDIR"/units/monitoring/alerts.yml $out/${monitoringDir}/
      '');

  # Where renderedUnits puts the monitoring files (relative to its $out).
  monitoringDir = "share/pdserve/monitoring";
  dashboardDir = "${monitoringDir}/dashboards";
  # Store paths only: referencing them is fine, reading them here would be import-from-derivation.
  # The scrape jobs are computed from the settings instead (derived.nix, the same as Python's).
  alertsFile = d: "${renderedUnits d}/${monitoringDir}/alerts.yml";

  grafana = config.services.grafana.provision;
  grafanaWired = cfg.monitoring.grafana.enable && monitored != [ ];
  dashboardProviders = map (d: {
    name = "pdserve-${d.settings.name}";
    type = "file";
    options.path = "${renderedUnits d}/${dashboardDir}";
  }) monitored;
  datasources = lib.optional (cfg.monitoring.grafana.datasourceUrl != null) {
    name = "pdserve Prometheus";
    type = "prometheus";
    url = cfg.monitoring.grafana.datasourceUrl;
  };

  prometheusUrl =
    let
      p = config.services.prometheus;
    in
    "http://${derived.connectHost p.listenAddress}:${toString p.port}";

  gpuEnvironment = {
    # Triton finds libcuda.so.1 through `ldconfig -p`, which has no answer on NixOS; this is its
    # own knob for the driver's library directory.
    TRITON_LIBCUDA_PATH = "${pkgs.addDriverRunpath.driverLink}/lib";
  };

  # What starts at boot follows settings.boot_layout; NixOS generates the wants links from
  # wantedBy (the [Install] sections of the rendered units are not read here).
  unitsOf =
    d:
    let
      names = unitNames d;
      bootTarget = d.settings.systemd.wanted_by;
      atBoot = layout: {
        wantedBy = lib.optional (d.settings.boot_layout == layout) bootTarget;
      };
      # The sandbox (ProtectSystem=strict, the device allow list, ...) is in the rendered units
      # (pdserve.render.hardening), the same on every host; nothing here adds to it.
      worker = {
        environment = gpuEnvironment;
        # NixOS writes PATH for every service it declares, over the rendered unit's: keep what the unit
        # puts first, the SGLang env's bin (FlashInfer JIT-builds with the `ninja` there), and add numactl,
        # with which SGLang binds its scheduler processes to each GPU's NUMA node, looked up on PATH.
        path = [
          cfg.sglangPackage
          pkgs.numactl
        ];
      };
    in
    if multiHost d then
      # Only this host's units; a multi-host file has no fallback, so they are the PD layout's.
      lib.mapAttrs (_: role: (if role == "router" then { } else worker) // atBoot "pd") (hostUnitsOf d)
    else
      {
        ${names.prefill} = worker // atBoot "pd";
        ${names.decode} = worker // atBoot "pd";
        ${names.router} = atBoot "pd";
        # Always installed; wanted at boot only in the single layout. `pdserve cutover` switches now.
        ${names.fallback} = worker // atBoot "single";
      };

  # Across deployments, checked here at evaluation (before anything builds) so the message can name
  # the option to change; `pdserve check` of all deployments (checkedDeployments) holds the same rule
  # and is what decides at build time. The listeners are pdserve.schema.rules_across.listeners: tests/nix
  # makes each of those collide and expects this assertion to name it.
  listenersOf =
    attrName: d:
    map
      (
        field:
        let
          port = lib.getAttrFromPath (lib.splitString "." field) d.settings;
        in
        {
          inherit attrName field port;
          first = port;
          last = port;
        }
      )
      (
        [
          "prefill.port"
          "decode.port"
          "router.port"
          "router.prometheus_port"
          "transfer.bootstrap_port"
        ]
        # smg's probe port, where the deployment sets one.
        ++ lib.optional ((d.settings.router.health_check_port or null) != null) "router.health_check_port"
        # By default the fallback takes its own router's port, which never runs beside it.
        ++ lib.optional ((d.settings.fallback.port or null) != null
          && d.settings.fallback.port != d.settings.router.port
        ) "fallback.port"
      );
  allListeners = lib.concatLists (
    lib.mapAttrsToList (attrName: d: if multiHost d then placedListenersOf attrName d else listenersOf attrName d) cfg.deployments
  );
  # A multi-host file's listeners on this host (pdserve.schema.listeners.listeners_on, through derived.nix):
  # each with the port range it binds and the hosts that must reach it.
  hostListenersOf = d: derived.hostListeners schema d.settings cfg.host;
  placedListenersOf =
    attrName: d:
    map (l: {
      inherit attrName;
      inherit (l) field first last;
      port = l.first;
    }) (hostListenersOf d);
  overlaps = a: b: a.first <= b.last && b.first <= a.last;

  # The first port above `port` that no deployment's listener (a port or a range) holds: what the messages suggest.
  freePortFrom =
    port: if lib.any (l: overlaps l { first = port; last = port; }) allListeners then freePortFrom (port + 1) else port;
  portCollisions = lib.concatLists (
    lib.imap0 (
      i: l:
      let
        earlier = lib.findFirst (o: overlaps o l && o.attrName != l.attrName) null (lib.take i allListeners);
      in
      lib.optional (earlier != null) {
        assertion = false;
        message = ''
          services.pdserve.deployments.${l.attrName}.settings.${l.field} = ${toString l.port} is also
          deployments.${earlier.attrName}.settings.${earlier.field}; two deployments on one host cannot listen on
          one port. Write services.pdserve.deployments.${l.attrName}.settings.${l.field} = ${toString (freePortFrom l.port)};
        '';
      }
    ) allListeners
  );

  # One message per deployment whose units another deployment (earlier in attribute order) has.
  deploymentUnits = lib.mapAttrsToList (attrName: d: {
    inherit attrName;
    units = if multiHost d then lib.attrNames (hostUnitsOf d) else lib.attrValues (unitNames d);
  }) cfg.deployments;
  unitCollisions = lib.concatLists (
    lib.imap0 (
      i: mine:
      let
        earlier = lib.take i deploymentUnits;
        owner = lib.findFirst (o: lib.any (unit: lib.elem unit o.units) mine.units) null earlier;
        unit = lib.findFirst (u: lib.elem u owner.units) null mine.units;
      in
      lib.optional (owner != null) {
        assertion = false;
        message = ''
          services.pdserve.deployments.${mine.attrName} and deployments.${owner.attrName} both have the unit
          ${unit}.service. Write services.pdserve.deployments.${mine.attrName}.settings.name = "${mine.attrName}2";
          (a name that is neither another deployment's name nor one plus -prefill, -decode or -router).
        '';
      }
    ) deploymentUnits
  );

  # The firewall of this host's multi-host deployments, on top of NixOS' (which refuses every port it does
  # not allow): each worker port (pdserve.schema.listeners) opened to the cluster addresses of the hosts
  # that use it, closed to the deployment's other hosts, and, with openToPeers, everything else open to
  # them. firewall.nix builds it from validated, quoted values only (a bad one is an assertion and no rule);
  # `pdserve render --host` writes the worker ports' part as nftables for hosts without NixOS.
  firewall = (import ./firewall.nix { inherit lib; }).build {
    inherit schema;
    deployments = lib.mapAttrs (_: d: d.settings) cfg.deployments;
    inherit (cfg) host openToPeers;
  };
  inherit (firewall) firewalls nftRules iptablesRules;
  nftables = config.networking.nftables.enable;

  users = lib.unique (map (d: d.settings.systemd.user) deployments);
  groups = lib.unique (map (d: d.settings.systemd.group) deployments);
in
{
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

    hostFirewall = mkOption {
      type = types.listOf (types.attrsOf types.anything);
      readOnly = true;
      internal = true;
      default = firewalls;
      description = ''
        What the module opens and closes in the firewall for this host's multi-host deployments: per
        deployment, the worker ports opened (first and last port, source addresses), the worker ports
        closed to its other hosts, and those hosts' addresses (openToPeers).
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
          default = if config.services.prometheus.enable then prometheusUrl else null;
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
      type = types.attrsOf (types.submodule deploymentModule);
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
    ]
    ++ unitCollisions
    ++ portCollisions
    ++ map (message: {
      assertion = false;
      inherit message;
    }) firewall.problems
    ++ lib.concatLists (
      lib.mapAttrsToList (
        attrName: d:
        let
          at = "services.pdserve.deployments.${attrName}";
          keyFile = d.settings.router.api_key_file or null;
        in
        [
          {
            assertion = d.openFirewall -> !(isLoopback d.settings.router.host);
            message = ''
              ${at}.openFirewall opens port ${toString d.settings.router.port}, but the router listens on
              ${d.settings.router.host} only. Write ${at}.settings.router.host = "0.0.0.0"; (and set
              ${at}.apiKeyFile), or drop openFirewall.
            '';
          }
          {
            # Opening the firewall to a router without a key hands the model to the network.
            assertion = d.openFirewall -> keyFile != null;
            message = ''
              ${at}.openFirewall publishes the router on port ${toString d.settings.router.port} without an
              API key. Write ${at}.apiKeyFile = "/run/keys/pdserve-api-key"; (a file outside the Nix store,
              e.g. provisioned by agenix or sops-nix), or drop openFirewall.
            '';
          }
          {
            assertion = multiHost d -> lib.elem cfg.host (derived.hostNames d.settings);
            message = ''
              ${at} is a multi-host deployment of the hosts ${lib.concatStringsSep ", " (derived.hostNames d.settings)},
              and services.pdserve.host = "${cfg.host}" is none of them. Write services.pdserve.host = "${lib.head (derived.hostNames d.settings ++ [ "" ])}";
              (this machine's name among the deployment's [hosts]; it defaults to networking.hostName).
            '';
          }
          {
            assertion = d.apiKeyFile == null || lib.hasPrefix "/" d.apiKeyFile;
            message = ''
              ${at}.apiKeyFile = "${toString d.apiKeyFile}" is not an absolute path. Write the full
              path of the key file, e.g. ${at}.apiKeyFile = "/run/keys/pdserve-api-key";
            '';
          }
          {
            assertion = keyFile == null || !(lib.hasPrefix builtins.storeDir (toString keyFile));
            message = ''
              ${at}: the API key file ${toString keyFile} is in the Nix store, which every user can
              read. Keep the key outside the store (e.g. /run/keys/pdserve-api-key, provisioned by
              agenix, sops-nix or by hand) and write ${at}.apiKeyFile = "/run/keys/pdserve-api-key";
            '';
          }
        ]
      ) cfg.deployments
    );

    warnings =
      lib.concatLists (
        lib.mapAttrsToList (
          attrName: d:
          lib.optional
            (!(isLoopback d.settings.router.host) && !d.openFirewall && (d.settings.router.api_key_file or null) == null)
            ''
              services.pdserve: deployment ${attrName}'s router listens on ${d.settings.router.host}
              without an API key: anyone who reaches port ${toString d.settings.router.port} can use the model.
              Set services.pdserve.deployments.${attrName}.apiKeyFile.
            ''
        ) cfg.deployments
      )
      ++ lib.concatLists (
        lib.mapAttrsToList (
          attrName: d:
          lib.optional (multiHost d && lib.elem cfg.host (derived.hostNames d.settings) && hostUnitsOf d == { }) ''
            services.pdserve: deployment ${attrName} places no server and no router on host ${cfg.host}, so
            nothing of it is installed here. Place something on it, or drop the deployment from this host.
          ''
        ) cfg.deployments
      )
      ++ lib.optional (firewalls != [ ] && !config.networking.firewall.enable) ''
        services.pdserve: networking.firewall.enable is false, so every host that reaches this one can use
        the worker ports of ${lib.concatStringsSep ", " (map (f: f.deployment) firewalls)}, which bypass the
        router's API key; with the firewall on they are open only to the hosts that must reach them.
        Write networking.firewall.enable = true;
      ''
      # Set by hand on a host that does not run the service: the wiring would go nowhere.
      ++ lib.optional (cfg.monitoring.prometheus.enable && monitored != [ ] && !config.services.prometheus.enable) ''
        services.pdserve.monitoring.prometheus.enable adds scrape jobs and alert rules, but
        services.prometheus.enable is false, so nothing scrapes them. Write
        services.prometheus.enable = true; or drop services.pdserve.monitoring.prometheus.enable.
      ''
      ++ lib.optional (cfg.monitoring.grafana.enable && monitored != [ ] && !config.services.grafana.enable) ''
        services.pdserve.monitoring.grafana.enable provisions the dashboards, but services.grafana.enable
        is false. Write services.grafana.enable = true; or drop services.pdserve.monitoring.grafana.enable.
      ''
      ++ lib.optional (grafanaWired && grafana.dashboards.path != null) ''
        services.pdserve: services.grafana.provision.dashboards.path is set, so the pdserve dashboards are
        not provisioned. Add to that file: ${builtins.toJSON dashboardProviders}
      ''
      ++ lib.optional (grafanaWired && datasources != [ ] && grafana.datasources.path != null) ''
        services.pdserve: services.grafana.provision.datasources.path is set, so the data source
        "pdserve Prometheus" is not provisioned. Add it to that file, or write
        services.pdserve.monitoring.grafana.datasourceUrl = null; to leave it out.
      ''
      ++ lib.optional (!config.hardware.graphics.enable) ''
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

    # A multi-host deployment that places nothing here has nothing to install (a warning says so).
    systemd.packages = map renderedUnits (lib.filter (d: hostUnitsOf d != { }) deployments);
    systemd.services = lib.mkMerge (map unitsOf deployments);

    networking.firewall.allowedTCPPorts = lib.mkMerge (
      map (d: lib.mkIf (d.openFirewall && lib.elem "router" (lib.attrValues (hostUnitsOf d))) [
        d.settings.router.port
      ]) deployments
    );

    networking.firewall.extraInputRules = lib.mkIf (nftables && nftRules != [ ]) (lib.concatStringsSep "\n" nftRules);
    networking.firewall.extraCommands = lib.mkIf (!nftables && iptablesRules != [ ]) (
      lib.concatStringsSep "\n" iptablesRules
    );

    # Into a Prometheus and a Grafana the host runs, never turning either on (the options above).
    services.prometheus = lib.mkIf (cfg.monitoring.prometheus.enable && monitored != [ ]) {
      ruleFiles = map alertsFile monitored;
      scrapeConfigs = lib.concatMap (d: derived.scrapeConfigs schema d.settings) monitored;
    };
    # A provisioning file of the user's own (provision.*.path) excludes the settings form nixpkgs
    # writes; then nothing is added there (a warning says what to add) rather than failing its assertion.
    services.grafana.provision = lib.mkIf grafanaWired {
      enable = true;
      dashboards.settings = lib.mkIf (grafana.dashboards.path == null) { providers = dashboardProviders; };
      datasources.settings = lib.mkIf (grafana.datasources.path == null) { inherit datasources; };
    };
  };
}
