# What the module's files share: the options' values, pdserve's committed JSON Schema (where every
# default comes from) and what derived.nix computes of each deployment. Not a module: each file of the
# module imports it with its own `config` and `lib`.
{ config, lib }:
let
  cfg = config.services.pdserve;
  derived = import ./derived.nix;
  # `pdserve schema`, a source file: no import-from-derivation.
  schema = lib.importJSON ../pkg/pdserve/schema/deployment.schema.json;
  multiHost = d: derived.multiHost d.settings;
  unitNames = d: derived.unitNames d.settings.name;
  isMonitored = d: !multiHost d && derived.monitoringEnabled schema d.settings;
in
{
  inherit
    cfg
    derived
    schema
    multiHost
    unitNames
    isMonitored
    ;
  deployments = lib.attrValues cfg.deployments;

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
  monitored = lib.filter isMonitored (lib.attrValues cfg.deployments);
  # Where the rendered units' derivation puts the monitoring files (relative to its $out).
  monitoringDir = "share/pdserve/monitoring";
  dashboardDir = "share/pdserve/monitoring/dashboards";
}
