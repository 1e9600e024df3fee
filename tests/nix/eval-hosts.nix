# What the evaluation tier (tests/nix/test_eval_hosts.py) reads from every host of the multi-host examples
# (nixosConfigurations.<example>-<host>), and from two variants of each made with its own extendModules:
# nftables instead of iptables, and a services.pdserve.host the deployment does not have. Nothing is built.
#   nix eval --json .#nixosConfigurations --apply 'configs: import ./tests/nix/eval-hosts.nix { inherit configs; }'
{ configs }:
let
  inherit (configs.gpu-host.pkgs) lib;
  names = lib.filter (name: name != "gpu-host") (lib.attrNames configs);
  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
  variant = system: modules: (system.extendModules { inherit modules; }).config;

  summary =
    system:
    let
      config = system.config;
      pdserve = config.services.pdserve;
      nftables = variant system [ { networking.nftables.enable = true; } ];
      elsewhere = variant system [ { services.pdserve.host = lib.mkForce "not-a-host"; } ];
    in
    {
      failed = failedAssertions config;
      inherit (config) warnings;
      toplevel = config.system.build.toplevel.drvPath;
      inherit (pdserve) host;
      settings = lib.mapAttrs (_: d: d.settings) pdserve.deployments;
      # The module's part of each unit it declares (the rendered unit files come from renderedUnits).
      units = lib.mapAttrs (_: service: {
        inherit (service) wantedBy environment;
        serviceConfig = lib.attrNames service.serviceConfig;
      }) (lib.filterAttrs (name: _: lib.hasPrefix "sglang-" name) config.systemd.services);
      renderedUnits = map (p: p.drvPath) (
        lib.filter (p: builtins.match "pdserve-.*-units" p.name != null) config.systemd.packages
      );
      firewall = pdserve.hostFirewall;
      inherit (config.networking.firewall) allowedTCPPorts extraCommands;
      nftables = {
        failed = failedAssertions nftables;
        inherit (nftables) warnings;
        inherit (nftables.networking.firewall) extraInputRules extraCommands;
      };
      elsewhere = failedAssertions elsewhere;
    };
in
lib.genAttrs names (name: summary configs.${name})
