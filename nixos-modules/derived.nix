# What the module derives from a deployment exactly as pdserve does: the unit names
# (pdserve.schema.derived.unit_name) and whether a listen address is loopback
# (pdserve.schema.rules.is_loopback, Python's ipaddress). Builtins only, so that CI's Nix 2.8 holds
# both against the Python functions without nixpkgs (tests/nix/test_nix.py); the evaluation tier
# holds the module's assertions against them (tests/nix/test_eval.py).
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
in
{
  isLoopback = host: host == "localhost" || isLoopbackIPv4 host || isLoopbackIPv6 host;

  unitNames = name: {
    prefill = "sglang-${name}-prefill";
    decode = "sglang-${name}-decode";
    router = "sglang-${name}-router";
    fallback = "sglang-${name}";
  };
}
