# The firewall of services.pdserve: the router's port where a deployment asks (openFirewall), and for this
# host's multi-host deployments, on top of NixOS' (which refuses every port it does not allow), each worker
# port (pdserve.schema.listeners) opened to the cluster addresses of the hosts that use it, closed to the
# deployment's other hosts, and, with openToPeers, everything else open to them. firewall-rules.nix builds
# it from validated, quoted values only (a bad one is an assertion and no rule); `pdserve render --host`
# writes the worker ports' part as nftables for hosts without NixOS.
{ config, lib, ... }:
let
  inherit (import ./common.nix { inherit config lib; })
    cfg
    schema
    deployments
    hostUnitsOf
    ;
  firewall = (import ./firewall-rules.nix { inherit lib; }).build {
    inherit schema;
    deployments = lib.mapAttrs (_: d: d.settings) cfg.deployments;
    inherit (cfg) host openToPeers;
  };
  inherit (firewall) firewalls nftRules iptablesRules;
  nftables = config.networking.nftables.enable;
in
{
  options.services.pdserve.hostFirewall = lib.mkOption {
    type = lib.types.listOf (lib.types.attrsOf lib.types.anything);
    readOnly = true;
    internal = true;
    default = firewalls;
    description = ''
      What the module opens and closes in the firewall for this host's multi-host deployments: per
      deployment, the worker ports opened (first and last port, source addresses), the worker ports
      closed to its other hosts, and those hosts' addresses (openToPeers).
    '';
  };

  config = lib.mkIf cfg.enable {
    assertions = map (message: {
      assertion = false;
      inherit message;
    }) firewall.problems;

    warnings = lib.optional (firewalls != [ ] && !config.networking.firewall.enable) ''
      services.pdserve: networking.firewall.enable is false, so every host that reaches this one can use
      the worker ports of ${lib.concatStringsSep ", " (map (f: f.deployment) firewalls)}, which bypass the
      router's API key; with the firewall on they are open only to the hosts that must reach them.
      Write networking.firewall.enable = true;
    '';

    # Only where this host runs the deployment's router.
    networking.firewall.allowedTCPPorts = lib.mkMerge (
      map (
        d:
        lib.mkIf (d.openFirewall && lib.elem "router" (lib.attrValues (hostUnitsOf d))) [
          d.settings.router.port
        ]
      ) deployments
    );

    networking.firewall.extraInputRules = lib.mkIf (nftables && nftRules != [ ]) (lib.concatStringsSep "\n" nftRules);
    networking.firewall.extraCommands = lib.mkIf (!nftables && iptablesRules != [ ]) (
      lib.concatStringsSep "\n" iptablesRules
    );
  };
}
