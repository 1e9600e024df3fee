# What the evaluation tier (tests/nix/test_eval_hosts.py) reads from every host of the multi-host examples
# (nixosConfigurations.<example>-<host>), and from two variants of each made with its own extendModules:
# nftables instead of iptables, and a services.pdserve.host the deployment does not have; of four-host-gpu-c,
# also one with another host's address made hostile (shell code in a zone ID). Nothing is built.
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
      # The rendered servers' PATH starts here (FlashInfer's ninja); the module's own PATH must too.
      sglangBin = "${pdserve.sglangPackage}/bin";
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

  # Another host's cluster address holding shell code in a zone ID (issue 37): refused by an assertion,
  # and no firewall rule built, in either language.
  hostile =
    system:
    let
      pdserve = system.config.services.pdserve;
      attrName = lib.head (lib.attrNames pdserve.deployments);
      peer = lib.head (lib.filter (h: h != pdserve.host) (lib.attrNames pdserve.deployments.${attrName}.settings.hosts));
      address = "fe80::1%$(touch pwned);";
      hostileAddress = {
        services.pdserve.deployments.${attrName}.settings.hosts.${peer}.address = lib.mkForce address;
      };
      iptables = variant system [ hostileAddress ];
      nftables = variant system [
        hostileAddress
        { networking.nftables.enable = true; }
      ];
    in
    {
      inherit attrName peer address;
      failed = failedAssertions iptables;
      firewall = iptables.services.pdserve.hostFirewall;
      inherit (iptables.networking.firewall) extraCommands;
      inherit (nftables.networking.firewall) extraInputRules;
    };
in
lib.genAttrs names (
  name: summary configs.${name} // lib.optionalAttrs (name == "four-host-gpu-c") { hostile = hostile configs.${name}; }
)
