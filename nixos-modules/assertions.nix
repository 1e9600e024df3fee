# What services.pdserve checks while it evaluates, so that a message can name the NixOS option to change:
# the deployments of one host against each other (listener ports, unit names), each deployment's
# openFirewall, apiKeyFile and host, and the warnings that go with them. `pdserve check` of all
# deployments (units.nix) holds the same cross-deployment rules and is what decides at build time.
{ config, lib, ... }:
let
  inherit (import ./common.nix { inherit config lib; })
    cfg
    derived
    schema
    multiHost
    unitNames
    hostUnitsOf
    ;
  inherit (derived) isLoopback;

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
in
{
  config = lib.mkIf cfg.enable {
    assertions =
      unitCollisions
      ++ portCollisions
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
      );
  };
}
