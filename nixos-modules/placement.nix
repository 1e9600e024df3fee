# Where a multi-host file ([hosts], [[prefill]], [[decode]], router.hosts) puts its units and listeners on
# one host, as pdserve.schema.topology and pdserve.schema.listeners place them: the module installs those
# units (wantedBy, the workers' environment) and opens those ports. The names and the port span come from
# pdserve (from-python.json, through derived.nix); what is walked here is the file's own structure. Builtins only:
# CI's Nix 2.8 holds it against the Python functions (tests/nix/test_nix_hosts.py).
{
  python,
  orDefault,
  unitNames,
  serverUnitOf,
}:
let
  # pdserve.schema.topology for a multi-host file ([hosts], [[prefill]], [[decode]], router.hosts): the
  # PD servers in its order (prefill first, each role in file order), named <role>-<n> unless named.
  multiHost = settings: (settings.hosts or { }) != { };
  placedServers =
    settings:
    builtins.concatMap (
      role:
      let
        written = settings.${role} or [ ];
        placed = if builtins.isList written then written else [ ];
      in
      builtins.genList (
        i:
        let
          server = builtins.elemAt placed i;
        in
        {
          inherit role server;
          name = if (server.name or null) != null then server.name else "${role}-${toString (i + 1)}";
          field = "${role}[${toString i}]";
          inherit (server) hosts port;
        }
      ) (builtins.length placed)
    ) [ "prefill" "decode" ];
  routerHosts = settings: (settings.router or { }).hosts or [ ];

  # topology.server_unit and topology.router_unit, from pdserve's templates: node 0 keeps the server's
  # name, node n adds -node<n>; with routers on several hosts each adds its host's name.
  serverUnit =
    settings: server: rank:
    serverUnitOf settings.name server.name + (if rank == 0 then "" else "${python.node_unit_suffix}${toString rank}");
  routerUnit =
    settings: host:
    (unitNames settings.name).router + (if builtins.length (routerHosts settings) <= 1 then "" else "-${host}");

  # The units `pdserve render --host <host>` writes for a multi-host file: unit name (no .service) -> role.
  hostUnits =
    settings: host:
    builtins.listToAttrs (
      builtins.concatMap (
        server:
        builtins.concatLists (
          builtins.genList (
            rank:
            if builtins.elemAt server.hosts rank == host then
              [
                {
                  name = serverUnit settings server rank;
                  value = server.role;
                }
              ]
            else
              [ ]
          ) (builtins.length server.hosts)
        )
      ) (placedServers settings)
    )
    // (if builtins.elem host (routerHosts settings) then { ${routerUnit settings host} = "router"; } else { });

  unique = list: builtins.foldl' (seen: x: if builtins.elem x seen then seen else seen ++ [ x ]) [ ] list;
  # `hosts` once each, in order, without `but` (a host reaches itself over loopback or its own address).
  reachedFrom = hosts: but: unique (builtins.filter (h: h != but) hosts);
  # pdserve.schema.topology.DIST_INIT_SPAN: --dist-init-addr's port and the ports SGLang binds above it.
  distInitSpan = python.dist_init_span;

  # pdserve.schema.listeners.listeners_on: what a host of a multi-host file listens on, and which hosts
  # must reach each listener (the firewall opens exactly these ports to exactly those hosts' addresses).
  hostListeners =
    schema: settings: host:
    let
      routers = routerHosts settings;
      placed = placedServers settings;
      decodeHosts = builtins.concatMap (s: s.hosts) (builtins.filter (s: s.role == "decode") placed);
      # Node 0 hosts of the servers of the other role (pdserve.launch.handoff's peers).
      warmers = s: map (o: builtins.head o.hosts) (builtins.filter (o: o.role != s.role) placed);
      transfer = orDefault schema "TransferSpec" (settings.transfer or { });
      router = orDefault schema "RouterSpec" (settings.router or { });
      listener = on: field: first: last: purpose: from: {
        host = on;
        inherit field first last purpose;
        reached_from = from;
        worker_port = true;
      };
      ofServer =
        s:
        let
          head = builtins.head s.hosts;
          rest = builtins.tail s.hosts;
          ownBootstrap = (s.server.bootstrap_port or null) != null;
          bootstrap = if ownBootstrap then s.server.bootstrap_port else transfer "bootstrap_port";
          distInit = s.server.dist_init_port or null;
        in
        # The routers proxy to it; the other role's servers' gates send their warm-up hand-off through it.
        [ (listener head "${s.field}.port" s.port s.port "${s.name} HTTP API" (reachedFrom (routers ++ warmers s) head)) ]
        ++ builtins.genList (
          i:
          listener (builtins.elemAt rest i) "${s.field}.port" s.port s.port
            "${s.name} node ${toString (i + 1)} health (SGLang's health-only server)"
            [ ]
        ) (builtins.length rest)
        ++ (
          if s.role == "prefill" then
            [
              (listener head (if ownBootstrap then "${s.field}.bootstrap_port" else "transfer.bootstrap_port") bootstrap
                bootstrap "${s.name} KV bootstrap" (reachedFrom (decodeHosts ++ rest) head))
            ]
          else
            [ ]
        )
        ++ (
          if rest != [ ] && distInit != null then
            [
              (listener head "${s.field}.dist_init_port" distInit (distInit + distInitSpan - 1)
                "${s.name} dist-init (multi-node TP)" (reachedFrom rest head))
            ]
          else
            [ ]
        );
      ofRouter = on: [
        ((listener on "router.port" (router "port") (router "port") "router" [ ]) // { worker_port = false; })
        ((listener on "router.prometheus_port" (router "prometheus_port") (router "prometheus_port") "router metrics" [ ])
          // { worker_port = false; })
      ]
      # smg's probe port, where the deployment sets one (unset: off).
      ++ (
        if router "health_check_port" != null then
          [
            ((listener on "router.health_check_port" (router "health_check_port") (router "health_check_port")
              "router probes" [ ]) // { worker_port = false; })
          ]
        else
          [ ]
      );
    in
    builtins.filter (l: l.host == host) (builtins.concatMap ofServer placed ++ builtins.concatMap ofRouter routers);
in
{
  inherit multiHost hostUnits hostListeners placedServers routerHosts distInitSpan;
  hostNames = settings: builtins.attrNames (settings.hosts or { });
}
