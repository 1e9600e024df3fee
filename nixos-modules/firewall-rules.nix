# The firewall of this host's multi-host deployments (services.pdserve, networking.firewall): which worker
# ports open to which cluster addresses, as nftables rules (extraInputRules) and as iptables commands
# (extraCommands, run as root by the firewall service). Both are code, so nothing from a deployment reaches
# them unchecked: every cluster address must pass the rule `pdserve check` applies (addresses.nix), every
# port must be an integer 1-65535, names must be [a-z0-9-]. A deployment with any bad value gives an
# assertion (option path, value, fix) and no firewall line at all. The iptables commands quote every value
# with lib.escapeShellArg besides; nftables has no quoting for an address, so its emitter refuses any
# address that did not pass the rule.
#
# Builtins only, but for `lib.escapeShellArg` (the one function of lib read here), so that CI's Nix 2.8
# evaluates this very file without nixpkgs (tests/nix/test_firewall_nix.py); the module imports it with
# nixpkgs' lib.
{ lib }:
let
  derived = import ./derived.nix;
  # The cluster-address rule (pdserve.schema.addresses), builtins only.
  addresses = import ./addresses.nix;
  inherit (addresses) addressProblem isIPv6;
  q = lib.escapeShellArg;

  matches = regex: text: builtins.isString text && builtins.match regex text != null;
  unique = list: builtins.foldl' (seen: x: if builtins.elem x seen then seen else seen ++ [ x ]) [ ] list;
  shown = builtins.toJSON; # a value in a message: quoted, newlines and quotes escaped

  # pdserve.schema.fields.UNIT_NAME: deployment and server names (they become unit names and comments).
  nameRegex = "[a-z0-9][a-z0-9-]{0,40}";
  isPort = p: builtins.isInt p && p >= 1 && p <= 65535;

  # --- what a deployment puts into the firewall, and its problems -----------------------------------------
  hereOf = host: settings: derived.multiHost settings && derived.hostUnits settings host != { };
  addressOf = settings: h: ((settings.hosts or { }).${h} or { }).address or null;

  problemsOf =
    { schema, host }:
    attrName: settings:
    let
      at = "services.pdserve.deployments.${attrName}.settings";
      hostNames = unique (
        derived.hostNames settings
        ++ builtins.concatMap (s: s.hosts) (derived.placedServers settings)
        ++ derived.routerHosts settings
      );
      address =
        h:
        let
          value = addressOf settings h;
          problem = addressProblem value;
        in
        if problem == null then
          [ ]
        else
          [
            ''
              ${at}.hosts.${h}.address = ${shown value} ${problem.reason}. Write
              ${at}.hosts.${h}.address = "${problem.suggestion}"; (${problem.fix}). No firewall rule is built from it.
            ''
          ];
      name =
        field: example: value:
        if matches nameRegex value then
          [ ]
        else
          [
            ''
              ${at}.${field} = ${shown value} is not a name pdserve can use: lowercase letters, digits and dashes,
              at most 41 (it becomes part of unit names and of the firewall's comments). Write e.g. ${at}.${field} = "${example}";
            ''
          ];
      servers = builtins.filter (s: (s.server.name or null) != null) (derived.placedServers settings);
      # A bad port type fails before the listeners are computed from it (a range adds to its first port).
      port =
        l:
        let
          example =
            if builtins.match ".*bootstrap_port" l.field != null then
              "8998"
            else if builtins.match ".*dist_init_port" l.field != null then
              "5000"
            else
              "30000";
        in
        if isPort l.first && isPort l.last && l.first <= l.last then
          [ ]
        else if isPort l.first then
          [
            ''
              ${at}.${l.field} = ${toString l.first}: with the ports SGLang binds above it the range reaches
              ${shown l.last}, beyond 65535. Write e.g. ${at}.${l.field} = ${toString (65535 - (l.last - l.first))};
            ''
          ]
        else
          [
            ''
              ${at}.${l.field} = ${shown l.first} is not a port (an integer 1-65535). Write e.g. ${at}.${l.field} = ${example};
            ''
          ];
    in
    name "name" "dsv4" (settings.name or null)
    ++ builtins.concatMap (s: name "${s.field}.name" "${s.role}-big" s.server.name) servers
    ++ builtins.concatMap address hostNames
    ++ builtins.concatMap port (derived.hostListeners schema settings host);

  # What the firewall does for one deployment on `host`: each worker listener opened to the hosts that
  # must reach it, every worker port closed to the deployment's other hosts, and with openToPeers those
  # hosts trusted otherwise (SGLang's KV side channel on random ports, NCCL's and UCX's sockets).
  firewallOf =
    {
      schema,
      host,
      openToPeers,
    }:
    settings:
    let
      listeners = builtins.filter (l: l.worker_port) (derived.hostListeners schema settings host);
      address = addressOf settings;
    in
    {
      deployment = settings.name;
      opened = map (l: {
        inherit (l) first last purpose;
        sources = map address l.reached_from;
      }) (builtins.filter (l: l.reached_from != [ ]) listeners);
      closed = map (l: { inherit (l) first last; }) listeners;
      peers = if openToPeers then map address (builtins.filter (h: h != host) (derived.hostNames settings)) else [ ];
    };

  # --- the emitters --------------------------------------------------------------------------------------
  # A comment holds only what the validation let through (names, fixed words, port numbers): a newline in
  # it would start a command or a rule.
  comment =
    text:
    if matches "[A-Za-z0-9 ()._,:'-]*" text then "# ${text}" else throw "pdserve firewall: unsafe comment ${shown text}";
  portText = p: if isPort p then toString p else throw "pdserve firewall: ${shown p} is not a port";
  ports = separator: r: if r.first == r.last then portText r.first else "${portText r.first}${separator}${portText r.last}";
  optionals = condition: list: if condition then list else [ ];

  # All opened ports first, then the closed ones, then the peers: one deployment's peers must not pass
  # another's worker ports. `language` writes each part.
  rulesIn =
    language: firewalls:
    builtins.concatMap (
      f: builtins.concatMap (r: [ (comment "pdserve ${f.deployment}: ${r.purpose}") ] ++ language.open r) f.opened
    ) firewalls
    ++ builtins.concatMap (
      f:
      optionals (f.peers != [ ] && f.closed != [ ]) (
        [ (comment "pdserve ${f.deployment}: its worker ports, from its other hosts not named above") ] ++ language.close f
      )
    ) firewalls
    ++ builtins.concatMap (
      f:
      optionals (f.peers != [ ]) (
        [ (comment "pdserve ${f.deployment}: anything else from its other hosts (KV side channel, NCCL, UCX)") ]
        ++ language.trust f
      )
    ) firewalls;

  # nftables has no quoting for an address: one that did not pass the rule never gets here.
  nftAddress =
    a: if addresses.valid a then a else throw "pdserve firewall: ${shown a} reached the nftables rules unvalidated";
  byFamily =
    list: rule:
    let
      v4 = builtins.filter (a: !isIPv6 a) (map nftAddress list);
      v6 = builtins.filter isIPv6 (map nftAddress list);
    in
    optionals (v4 != [ ]) [ (rule "ip" v4) ] ++ optionals (v6 != [ ]) [ (rule "ip6" v6) ];
  nftSet = items: "{ ${builtins.concatStringsSep ", " items} }";
  nftables = {
    open = r: byFamily r.sources (family: set: "${family} saddr ${nftSet set} tcp dport ${ports "-" r} accept");
    close =
      f: byFamily f.peers (family: set: "${family} saddr ${nftSet set} tcp dport ${nftSet (map (ports "-") f.closed)} drop");
    trust = f: byFamily f.peers (family: set: "${family} saddr ${nftSet set} accept");
  };

  # Each value one shell word, quoted by lib.escapeShellArg whatever it holds.
  tool = a: if isIPv6 a then "ip6tables" else "iptables";
  iptables = {
    open = r: map (a: "${tool a} -A nixos-fw -p tcp -s ${q a} --dport ${q (ports ":" r)} -j nixos-fw-accept") r.sources;
    close =
      f:
      let
        closed = builtins.concatStringsSep "," (map (ports ":") f.closed);
      in
      map (a: "${tool a} -A nixos-fw -p tcp -s ${q a} -m multiport --dports ${q closed} -j DROP") f.peers;
    trust = f: map (a: "${tool a} -A nixos-fw -s ${q a} -j nixos-fw-accept") f.peers;
  };
in
{
  # The emitters alone, for tests that hand them values the validation would refuse.
  emit = {
    nftRules = rulesIn nftables;
    iptablesRules = rulesIn iptables;
  };

  # The firewall of `host` for `deployments` (attribute name -> settings, as services.pdserve.deployments):
  # the deployments that place a unit on it, their problems (assertion messages), and, only when there is
  # none, what each opens and closes and the rules in both languages. `schema` is pdserve's JSON Schema.
  build =
    {
      schema,
      deployments,
      host,
      openToPeers,
    }:
    let
      here = builtins.filter (attrName: hereOf host deployments.${attrName}) (builtins.attrNames deployments);
      problems = builtins.concatMap (attrName: problemsOf { inherit schema host; } attrName deployments.${attrName}) here;
      firewalls =
        if problems == [ ] then map (attrName: firewallOf { inherit schema host openToPeers; } deployments.${attrName}) here else [ ];
    in
    {
      inherit problems firewalls;
      nftRules = rulesIn nftables firewalls;
      iptablesRules = rulesIn iptables firewalls;
    };
}
