# The monitoring wiring of services.pdserve: for every single-host deployment whose settings turn
# monitoring on, its scrape jobs and rendered alert rules into the Prometheus this host runs, and its
# dashboard (and a data source) into its Grafana, never turning either service on. The scrape jobs are
# computed from the settings (derived.nix, with pdserve's job shape from from-python.json): reading the
# rendered prometheus-scrape.yml here would be import-from-derivation. The rendered files are only
# referenced, by store path.
{ config, lib, ... }:
let
  inherit (import ./common.nix { inherit config lib; })
    cfg
    derived
    schema
    monitored
    monitoringDir
    dashboardDir
    ;
  grafana = config.services.grafana.provision;
  grafanaWired = cfg.monitoring.grafana.enable && monitored != [ ];

  dashboardProviders = map (d: {
    name = "pdserve-${d.settings.name}";
    type = "file";
    options.path = "${d.units}/${dashboardDir}";
  }) monitored;
  datasources = lib.optional (cfg.monitoring.grafana.datasourceUrl != null) {
    name = "pdserve Prometheus";
    type = "prometheus";
    url = cfg.monitoring.grafana.datasourceUrl;
  };
in
{
  config = lib.mkIf cfg.enable {
    # Into a Prometheus and a Grafana the host runs, never turning either on (the options in pdserve.nix).
    services.prometheus = lib.mkIf (cfg.monitoring.prometheus.enable && monitored != [ ]) {
      ruleFiles = map (d: "${d.units}/${monitoringDir}/alerts.yml") monitored;
      scrapeConfigs = lib.concatMap (d: derived.scrapeConfigs schema d.settings) monitored;
    };
    # A provisioning file of the user's own (provision.*.path) excludes the settings form nixpkgs
    # writes; then nothing is added there (a warning says what to add) rather than failing its assertion.
    services.grafana.provision = lib.mkIf grafanaWired {
      enable = true;
      dashboards.settings = lib.mkIf (grafana.dashboards.path == null) { providers = dashboardProviders; };
      datasources.settings = lib.mkIf (grafana.datasources.path == null) { inherit datasources; };
    };

    warnings =
      # Set by hand on a host that does not run the service: the wiring would go nowhere.
      lib.optional (cfg.monitoring.prometheus.enable && monitored != [ ] && !config.services.prometheus.enable) ''
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
      '';
  };
}
