# What the module needs of pdserve's computation. The names and shapes pdserve computes come as data:
# from-python.json, which pdserve writes (pdserve.render.nixos_data) with `@name@`-style slots that are
# filled in here. What stays in Nix: which listen address is loopback (every spelling Python's
# ipaddress reads), where a client on the host connects to a listener, and which settings key a
# scrape target reads. Builtins only, so that CI's Nix 2.8 holds it against the Python functions without
# nixpkgs (tests/nix/test_nix.py); the evaluation tier holds the module's assertions and its
# services.prometheus wiring against them (tests/nix/test_eval.py).
let
  python = builtins.fromJSON (builtins.readFile ./from-python.json);
  fill = slots: builtins.replaceStrings (builtins.attrNames slots) (builtins.attrValues slots);
  matches = regex: text: builtins.match regex text != null;

  # pdserve.schema.derived.unit_name and topology.server_unit (node 0).
  unitNames = name: builtins.mapAttrs (_: fill { "@name@" = name; }) python.unit_names;
  serverUnitOf =
    name: server:
    fill {
      "@name@" = name;
      "@server@" = server;
    } python.server_unit;

  # pdserve.schema.addresses.is_loopback, every spelling Python's ipaddress reads (the openFirewall
  # assertion names a non-canonical one at evaluation; `pdserve check` refuses it at build time).
  splitOn = separator: text: builtins.filter builtins.isString (builtins.split separator text);
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

  isLoopback = host: host == "localhost" || isLoopbackIPv4 host || isLoopbackIPv6 host;

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

  # pdserve.render.monitoring.scrape.scrape_configs: pdserve's job for each scraped role, aimed at the
  # listener pdserve.render.monitoring.targets names (the router's Prometheus listener; the fallback's
  # host and port default to the router's).
  scrapeConfigs =
    schema: settings:
    let
      router = orDefault schema "RouterSpec" (settings.router or { });
      worker = role: orDefault schema "WorkerSpec" settings.${role};
      fallback = settings.fallback or { };
      # Python's `fallback.host or router.host`: unset (null) or empty takes the router's.
      fallbackOr =
        key: routerKey:
        if (fallback.${key} or null) == null || fallback.${key} == "" || fallback.${key} == 0 then
          router routerKey
        else
          fallback.${key};
      where = {
        prefill = [ (worker "prefill" "host") (worker "prefill" "port") ];
        decode = [ (worker "decode" "host") (worker "decode" "port") ];
        router = [ (router "prometheus_host") (router "prometheus_port") ];
        fallback = [ (fallbackOr "host" "host") (fallbackOr "port" "port") ];
      };
      interval = orDefault schema "MonitoringSpec" (settings.monitoring or { }) "scrape_interval_secs";
      cap = python.scrape_job.timeout_cap_secs;
      seconds = n: "${toString n}s";
      job =
        role:
        let
          slots = fill {
            "@name@" = settings.name;
            "@role@" = role;
          };
          target = where.${role};
        in
        {
          job_name = slots python.scrape_job.job_name;
          inherit (python.scrape_job) metrics_path;
          scrape_interval = seconds interval;
          scrape_timeout = seconds (if interval < cap then interval else cap);
          static_configs = [
            {
              targets = [ "${connectHost (builtins.head target)}:${toString (builtins.elemAt target 1)}" ];
              labels = builtins.mapAttrs (_: slots) python.scrape_job.labels;
            }
          ];
        };
    in
    map job python.scraped_roles;

  placement = import ./placement.nix {
    inherit
      python
      orDefault
      unitNames
      serverUnitOf
      ;
  };
in
placement
// {
  inherit
    connectHost
    scrapeConfigs
    isLoopback
    unitNames
    ;

  # Whether `pdserve render` writes the monitoring files for these settings.
  monitoringEnabled = schema: settings: orDefault schema "MonitoringSpec" (settings.monitoring or { }) "enable";
}
