# What the module derives from a deployment exactly as pdserve does: the unit names
# (pdserve.schema.derived.unit_name), whether a listen address is loopback
# (pdserve.schema.rules.is_loopback, Python's ipaddress), the address a client on the host connects
# to (pdserve.schema.derived.connect_host) and the Prometheus scrape jobs
# (pdserve.render.monitoring.scrape.scrape_configs). Builtins only, so that CI's Nix 2.8 holds them
# against the Python functions without nixpkgs (tests/nix/test_nix.py); the evaluation tier holds the
# module's assertions and its services.prometheus wiring against them (tests/nix/test_eval.py).
let
  splitOn = separator: text: builtins.filter builtins.isString (builtins.split separator text);
  matches = regex: text: builtins.match regex text != null;
  last = list: builtins.elemAt list (builtins.length list - 1);
  allOf = predicate: list: builtins.all predicate list;

  # Dotted decimal as Python's ipaddress reads it: 0-255, no leading zeros.
  octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  isLoopbackIPv4 = host: matches "127\\.${octet}\\.${octet}\\.${octet}" host;

  # IPv6 is loopback when its value is ::1, however it is spelled (0::1, 0:0:0:0:0:0:0:1, ::0001,
  # ::0.0.0.1, with or without a %scope): every 16-bit group zero but the last, which is one.
  isZero = matches "0{1,4}";
  isOne = matches "0{0,3}1";
  isLoopbackIPv6 =
    host:
    let
      address = builtins.head (splitOn "%" host);
      halves = splitOn "::" address;
      groupsOf = half: if half == "" then [ ] else splitOn ":" half;
      groups = builtins.concatLists (map groupsOf halves);
      # An IPv4 tail is the last two groups; its value is 1 only as 0.0.0.1.
      tail = if groups == [ ] then "" else last groups;
      ipv4Tail = matches ".*\\..*" tail;
      width = builtins.length groups + (if ipv4Tail then 1 else 0);
      leading = if groups == [ ] then [ ] else builtins.genList (builtins.elemAt groups) (builtins.length groups - 1);
    in
    matches ".*:.*" host
    && builtins.length halves <= 2
    && (if builtins.length halves == 2 then width <= 7 && last halves != "" else width == 8)
    && groups != [ ]
    && allOf isZero leading
    && (if ipv4Tail then tail == "0.0.0.1" else isOne tail);

  # pdserve.schema.derived.connect_host: where a client on this host reaches a listener bound to `host`.
  connectHost =
    host:
    if host == "0.0.0.0" || host == "" then
      "127.0.0.1"
    else if host == "::" then
      "[::1]"
    else if matches ".*:.*" host then
      "[${host}]"
    else
      host;

  # A deployment key, else its default in pdserve's committed JSON Schema (`schema`, already read),
  # so that a key left out means the same here as to pdserve.
  orDefault =
    schema: section: settings: key:
    let
      value = settings.${key} or null;
    in
    if value != null then value else schema."$defs".${section}.properties.${key}.default;

  # pdserve.render.monitoring.targets + scrape.scrape_configs: one job per role, the router scraped on
  # its Prometheus listener, the fallback (host and port default to the router's) on its own job.
  scrapeConfigs =
    schema: settings:
    let
      router = orDefault schema "RouterSpec" (settings.router or { });
      worker = role: orDefault schema "WorkerSpec" settings.${role};
      fallback = settings.fallback or { };
      # Python's `fallback.host or router.host`: unset (null) or empty takes the router's.
      fallbackOr = key: routerKey: if (fallback.${key} or null) == null || fallback.${key} == "" || fallback.${key} == 0
        then router routerKey else fallback.${key};
      where = {
        prefill = { host = worker "prefill" "host"; port = worker "prefill" "port"; };
        decode = { host = worker "decode" "host"; port = worker "decode" "port"; };
        router = { host = router "prometheus_host"; port = router "prometheus_port"; };
        fallback = { host = fallbackOr "host" "host"; port = fallbackOr "port" "port"; };
      };
      interval = orDefault schema "MonitoringSpec" (settings.monitoring or { }) "scrape_interval_secs";
      seconds = n: "${toString n}s";
    in
    map (role: {
      job_name = "pdserve-${settings.name}-${role}";
      metrics_path = "/metrics";
      scrape_interval = seconds interval;
      scrape_timeout = seconds (if interval < 10 then interval else 10);
      static_configs = [
        {
          targets = [ "${connectHost where.${role}.host}:${toString where.${role}.port}" ];
          labels = {
            deployment = settings.name;
            inherit role;
          };
        }
      ];
    }) [ "prefill" "decode" "router" "fallback" ];

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

  # topology.server_unit and topology.router_unit: node 0 keeps the server's name, node n adds -node<n>;
  # with routers on several hosts each adds its host's name.
  serverUnit =
    settings: server: rank:
    "sglang-${settings.name}-${server.name}" + (if rank == 0 then "" else "-node${toString rank}");
  routerUnit =
    settings: host:
    "sglang-${settings.name}-router" + (if builtins.length (routerHosts settings) <= 1 then "" else "-${host}");

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
  # pdserve.schema.topology.DIST_INIT_SPAN: --dist-init-addr's port and the six SGLang binds above it.
  distInitSpan = 7;

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
  inherit connectHost scrapeConfigs multiHost hostUnits hostListeners placedServers routerHosts;
  hostNames = settings: builtins.attrNames (settings.hosts or { });

  # Whether `pdserve render` writes the monitoring files for these settings.
  monitoringEnabled = schema: settings: orDefault schema "MonitoringSpec" (settings.monitoring or { }) "enable";

  isLoopback = host: host == "localhost" || isLoopbackIPv4 host || isLoopbackIPv6 host;

  unitNames = name: {
    prefill = "sglang-${name}-prefill";
    decode = "sglang-${name}-decode";
    router = "sglang-${name}-router";
    fallback = "sglang-${name}";
  };
}
