# What the evaluation tier (tests/nix/test_eval.py) reads from the evaluated gpu-host and from variants
# of it, each made with the host's own extendModules (same pkgs, same module) and reduced to the
# options the tier asserts on. Nothing here is built. Applied to nixosConfigurations.gpu-host:
#   nix eval --json --impure .#nixosConfigurations.gpu-host --apply 'host: import ./tests/nix/eval-cases.nix { ... }'
{
  host,
  # An absolute key file outside the store; the tier looks for its content in the closure.
  keyFile,
  # pdserve.schema.rules_across.listeners' fields for the reference (Python is the list to match).
  listenerFields,
  # Router addresses (tests/nix/derived_cases.py) whose openFirewall assertion the tier compares with
  # pdserve.schema.rules.is_loopback.
  loopbackHosts ? [ ],
}:
let
  inherit (host.pkgs) lib;

  reference = builtins.fromTOML (builtins.readFile ../../hosts/gpu-host/deployment.toml);
  referenceSettings = host.config.services.pdserve.deployments.dsv4.settings;

  variant = modules: (host.extendModules { inherit modules; }).config;

  units = [
    "sglang-dsv4-prefill"
    "sglang-dsv4-decode"
    "sglang-dsv4-router"
    "sglang-dsv4"
  ];

  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  # What the tier reads of every variant; each field is evaluated only when read.
  summary = config: {
    failed = failedAssertions config;
    inherit (config) warnings;
    wantedBy = lib.genAttrs units (unit: config.systemd.units."${unit}.service".wantedBy);
    # The module's part of each unit (drop-ins on the rendered unit files).
    unitDrvs = lib.genAttrs units (unit: config.systemd.units."${unit}.service".unit.drvPath);
    serviceConfig = lib.genAttrs units (unit: builtins.attrNames config.systemd.services.${unit}.serviceConfig);
    # NixOS writes PATH for every unit it declares, over the rendered unit's (the module's `path`).
    path = lib.genAttrs units (unit: config.systemd.services.${unit}.environment.PATH);
    sglangPackage = "${config.services.pdserve.sglangPackage}";
    numactl = "${host.pkgs.numactl}";
    allowedTCPPorts = config.networking.firewall.allowedTCPPorts;
    settings = lib.mapAttrs (_: d: d.settings) config.services.pdserve.deployments;
    configFiles = lib.mapAttrs (_: d: d.configFile.drvPath) config.services.pdserve.deployments;
    toplevel = config.system.build.toplevel.drvPath;
  };

  dsv4 = settings: { services.pdserve.deployments.dsv4 = settings; };

  # The option values as they are written out: the nixpkgs submodules' unset (null) fields dropped.
  withoutNulls =
    value:
    if builtins.isAttrs value then
      lib.mapAttrs (_: withoutNulls) (lib.filterAttrs (_: v: v != null) value)
    else if builtins.isList value then
      map withoutNulls value
    else
      value;

  # What the tier reads of the monitoring wiring: all of services.prometheus' rule files and scrape
  # jobs and Grafana's provisioning (the variants add none of their own), and the rendered units'
  # store paths the wiring must point into.
  monitoringSummary =
    config:
    let
      provision = config.services.grafana.provision;
      renderedUnits = lib.filter (p: builtins.match "pdserve-.*-units" p.name != null) config.systemd.packages;
    in
    {
      failed = failedAssertions config;
      inherit (config) warnings;
      settings = lib.mapAttrs (_: d: d.settings) config.services.pdserve.deployments;
      inherit (config.services.prometheus) ruleFiles;
      scrapeConfigs = withoutNulls config.services.prometheus.scrapeConfigs;
      grafana = {
        inherit (provision) enable;
        dashboards = withoutNulls provision.dashboards.settings;
        datasources = withoutNulls provision.datasources.settings;
      };
      # Not outPath itself: JSON would turn the attribute set into that string.
      renderedUnits = map (p: {
        inherit (p) name drvPath;
        out = p.outPath;
      }) renderedUnits;
      toplevel = config.system.build.toplevel.drvPath;
    };

  # The host's Prometheus and Grafana, as their user would turn them on (Grafana needs its secret key;
  # a file provider keeps it out of the store and out of the warnings).
  services = {
    services.prometheus.enable = true;
    services.grafana.enable = true;
    services.grafana.settings.security.secret_key = "$__file{/run/keys/grafana-secret-key}";
  };
  monitoringOn = dsv4 { settings.monitoring.enable = true; };

  # A second deployment of the reference, every listener moved off the reference's.
  otherSettings = lib.recursiveUpdate reference {
    name = "other";
    prefill.port = 31000;
    decode.port = 31002;
    router.port = 31001;
    router.prometheus_port = 29002;
    router.health_check_port = 29003;
    transfer.bootstrap_port = 8999;
  };
  other = settings: { services.pdserve.deployments.other.settings = settings; };
  atField = field: lib.splitString "." field;
  referencePort = field: lib.getAttrFromPath (atField field) referenceSettings;
  collidingOn = field: lib.recursiveUpdate otherSettings (lib.setAttrByPath (atField field) (referencePort field));
in
{
  host = summary host.config;

  nvidia = {
    inherit (host.config.hardware.nvidia) open;
    datacenter = host.config.hardware.nvidia.datacenter.enable;
    driver = host.config.hardware.nvidia.package.name;
    productionDriver = host.config.boot.kernelPackages.nvidiaPackages.production.name;
    fabricmanager = host.config.systemd.services ? nvidia-fabricmanager;
    persistenced = host.config.systemd.services ? nvidia-persistenced;
    cudaCapabilities = host.pkgs.config.cudaCapabilities;
    graphics = host.config.hardware.graphics.enable;
  };

  single = summary (variant [ (dsv4 { settings.boot_layout = "single"; }) ]);

  openFirewall = summary (variant [
    (dsv4 {
      openFirewall = true;
      apiKeyFile = keyFile;
      settings.router.host = lib.mkForce "0.0.0.0";
    })
  ]);
  openFirewallOnLoopback = summary (variant [
    (dsv4 {
      openFirewall = true;
      apiKeyFile = keyFile;
    })
  ]);
  openFirewallWithoutKey = summary (variant [
    (dsv4 {
      openFirewall = true;
      settings.router.host = lib.mkForce "0.0.0.0";
    })
  ]);
  publicWithoutKey = summary (variant [ (dsv4 { settings.router.host = lib.mkForce "0.0.0.0"; }) ]);
  # openFirewall with a key: only a loopback router.host fails (the assertion's isLoopback).
  loopback = lib.genAttrs loopbackHosts (
    routerHost:
    (summary (variant [
      (dsv4 {
        openFirewall = true;
        apiKeyFile = keyFile;
        settings.router.host = lib.mkForce routerHost;
      })
    ])).failed
  );
  relativeKey = summary (variant [ (dsv4 { apiKeyFile = "keys/pdserve-api-key"; }) ]);
  storeKey = summary (variant [ (dsv4 { apiKeyFile = "${builtins.storeDir}/0000000000000000000000000000000a-key"; }) ]);

  twoDeployments = summary (variant [ (other otherSettings) ]);

  # Monitoring: on with both services; two deployments on (the second's router Prometheus listener on
  # every IPv6 address, its fallback on IPv6 loopback, a scrape interval under the 10 s timeout); on
  # without the services; the services without monitoring; on, the services on, the module's wiring off.
  monitoring = monitoringSummary (variant [
    services
    monitoringOn
  ]);
  monitoringTwo = monitoringSummary (variant [
    services
    monitoringOn
    (other (
      lib.recursiveUpdate otherSettings {
        router.prometheus_host = "::";
        fallback = {
          host = "::1";
          port = 31003;
        };
        monitoring = {
          enable = true;
          scrape_interval_secs = 5;
        };
      }
    ))
  ]);
  monitoringWithoutServices = monitoringSummary (variant [ monitoringOn ]);
  servicesWithoutMonitoring = monitoringSummary (variant [ services ]);
  monitoringWiringOff = monitoringSummary (variant [
    services
    monitoringOn
    {
      services.pdserve.monitoring.prometheus.enable = false;
      services.pdserve.monitoring.grafana.enable = false;
    }
  ]);
  # Grafana provisioned from files of the user's own, which exclude nixpkgs' settings form: nothing
  # added there, a warning each (rather than nixpkgs' "Cannot set both" assertion).
  grafanaProvisionedByFiles = monitoringSummary (variant [
    services
    monitoringOn
    {
      services.grafana.provision.dashboards.path = "/etc/grafana/dashboards.yaml";
      services.grafana.provision.datasources.path = "/etc/grafana/datasources.yaml";
    }
  ]);
  # The module's wiring asked for on a host that runs neither service: a warning each.
  monitoringWiringWithoutServices = monitoringSummary (variant [
    monitoringOn
    {
      services.pdserve.monitoring.prometheus.enable = true;
      services.pdserve.monitoring.grafana.enable = true;
    }
  ]);
  collisions = lib.genAttrs listenerFields (field: summary (variant [ (other (collidingOn field)) ]));
  fallbackCollision = summary (variant [ (other (lib.recursiveUpdate otherSettings { fallback.port = referencePort "decode.port"; })) ]);
  sameName = summary (variant [ (other (otherSettings // { name = "dsv4"; })) ]);
  unitNameOfAnother = summary (variant [ (other (otherSettings // { name = "dsv4-prefill"; })) ]);

  # Only what the schema requires: every other key comes from the module's defaults (the schema's).
  bare =
    (variant [
      {
        services.pdserve.deployments = lib.mkForce {
          bare.settings = {
            inherit (reference) model;
            prefill = {
              gpus = [ 0 ];
              port = 32000;
            };
            decode = {
              gpus = [ 1 ];
              port = 32002;
            };
            fallback.gpus = [
              0
              1
            ];
          };
        };
      }
    ]).services.pdserve.deployments.bare.settings;
}
