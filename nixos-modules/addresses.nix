# The cluster-address rule of pdserve.schema.addresses (cluster_address_problem), as `pdserve check` applies
# it, for the NixOS module's firewall: a cluster address is a canonical IPv4 dotted quad or a canonical
# lower-case IPv6 address (as Python's str(ipaddress.ip_address(...)) writes it), without a zone ID, not
# IPv4-mapped (::ffff:0:0/96), and routable unicast: not unspecified, loopback, broadcast, multicast,
# link-local (169.254.0.0/16, fe80::/10), site-local (fec0::/10) or reserved (0.0.0.0/8, 240.0.0.0/4, ::/8).
# An address that passes holds nothing but [0-9.] or [0-9a-f:], so it can stand in an nftables rule or a
# shell word as it is. Builtins only (CI's Nix 2.8 holds it against Python: tests/nix/test_firewall_nix.py).
let
  matches = regex: text: builtins.isString text && builtins.match regex text != null;
  splitOn = separator: text: builtins.filter builtins.isString (builtins.split separator text);
  last = list: builtins.elemAt list (builtins.length list - 1);
  range = from: to: if from > to then [ ] else builtins.genList (i: from + i) (to - from + 1);
  chars = text: builtins.genList (i: builtins.substring i 1 text) (builtins.stringLength text);
  # Literal, whatever else `text` holds (newlines included).
  contains = character: text: builtins.length (builtins.split character text) > 1;

  # --- the guards: the exact shapes an address must have to reach a rule ------------------------------
  octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  # A canonical dotted quad (Python's ipaddress refuses leading zeros; each part 0-255).
  ipv4Regex = "${octet}\\.${octet}\\.${octet}\\.${octet}";
  # Canonical IPv6 can only be made of lower-case hex groups of 1-4 digits and colons, 3 to 8 fields; the
  # full rule (canonicalIPv6 below) also needs the text to equal its canonical spelling.
  ipv6Regex = "[0-9a-f]{0,4}(:[0-9a-f]{0,4}){2,7}";

  # --- IPv6: parse any spelling Python's ipaddress reads (but zone IDs), to judge and to name the fix ------
  hexDigit = builtins.listToAttrs (
    builtins.genList (i: {
      name = builtins.substring i 1 "0123456789abcdef";
      value = i;
    }) 16
    ++ builtins.genList (i: {
      name = builtins.substring i 1 "ABCDEF";
      value = 10 + i;
    }) 6
  );
  hexValue = text: builtins.foldl' (n: c: n * 16 + hexDigit.${c}) 0 (chars text);
  toHex =
    n:
    let
      rest = n / 16;
      digit = builtins.substring (n - rest * 16) 1 "0123456789abcdef";
    in
    if rest == 0 then digit else toHex rest + digit;
  dottedValues =
    text:
    let
      o = map builtins.fromJSON (splitOn "\\." text);
      at = builtins.elemAt o;
    in
    [
      (at 0 * 256 + at 1)
      (at 2 * 256 + at 3)
    ];

  # The eight 16-bit groups of an IPv6 address, or null if `text` is none.
  ipv6Groups =
    text:
    let
      halves = splitOn "::" text;
      fieldsOf = half: if half == "" then [ ] else splitOn ":" half;
      # Only the address's very last field may be an IPv4 tail (two groups).
      valuesOf =
        fields: endsAddress:
        let
          tailIsDotted = endsAddress && fields != [ ] && matches ipv4Regex (last fields);
          hexFields = if tailIsDotted then builtins.genList (builtins.elemAt fields) (builtins.length fields - 1) else fields;
        in
        if builtins.all (matches "[0-9A-Fa-f]{1,4}") hexFields then
          map hexValue hexFields ++ (if tailIsDotted then dottedValues (last fields) else [ ])
        else
          null;
      compressed = builtins.length halves == 2;
      before = valuesOf (fieldsOf (builtins.head halves)) (!compressed);
      after = if compressed then valuesOf (fieldsOf (last halves)) true else [ ];
      count = builtins.length before + builtins.length after;
    in
    if !matches "[0-9A-Fa-f:.]{2,45}" text || builtins.length halves > 2 || before == null || after == null then
      null
    else if compressed then
      (if count <= 7 then before ++ builtins.genList (_: 0) (8 - count) ++ after else null)
    else if count == 8 then
      before
    else
      null;

  # Python's str(IPv6Address): lower-case hex without leading zeros, the longest run of two or more zero
  # groups (the first of equals) written as ::.
  canonicalIPv6 =
    groups:
    let
      zerosFrom = i: if i < 8 && builtins.elemAt groups i == 0 then 1 + zerosFrom (i + 1) else 0;
      best = builtins.foldl' (b: i: if zerosFrom i > b.length then { start = i; length = zerosFrom i; } else b) {
        start = null;
        length = 1;
      } (range 0 7);
      hex = list: builtins.concatStringsSep ":" (map toHex list);
      slice = from: to: builtins.genList (i: builtins.elemAt groups (from + i)) (to - from);
    in
    if best.start == null then hex groups else hex (slice 0 best.start) + "::" + hex (slice (best.start + best.length) 8);

  # --- the cluster-address rule (pdserve.schema.hosts, as `pdserve check` applies it) -----------------------
  # Each refusal: why, the value to write instead (an example, or the exact one where it is known) and how
  # to choose it.
  refused = reason: suggestion: fix: { inherit reason suggestion fix; };
  routable =
    reason: refused reason "10.0.0.1" "the host's own routable address on the cluster network, IPv4 or IPv6 such as fd00::1";
  notReachable =
    kind: routable "is ${kind} address; the servers placed on that host listen on it, and the other hosts must reach them there";
  unusable = kind: why: routable "is ${kind} address: ${why}";

  # The first class that holds the address names it (pdserve.schema.addresses' table, in its order).
  ipv4Problem =
    text:
    let
      o = map builtins.fromJSON (splitOn "\\." text);
      at = builtins.elemAt o;
    in
    if o == [ 0 0 0 0 ] then
      notReachable "a wildcard (unspecified)"
    else if at 0 == 0 then
      unusable "a reserved (0.0.0.0/8)" "it is reserved space, not an address a host is given"
    else if at 0 == 127 then
      notReachable "a loopback"
    else if at 0 == 169 && at 1 == 254 then
      unusable "a link-local (169.254.0.0/16)" "it is not routed beyond its link"
    else if at 0 >= 224 && at 0 <= 239 then
      unusable "a multicast (224.0.0.0/4)" "it names a group, not a host"
    else if o == [ 255 255 255 255 ] then
      unusable "the broadcast" "no host has it"
    else if at 0 >= 240 then
      unusable "a reserved (240.0.0.0/4)" "it is reserved space, not an address a host is given"
    else
      null;

  ipv6Problem =
    text: groups:
    let
      at = builtins.elemAt groups;
      byte = n: [
        (n / 256)
        (n - n / 256 * 256)
      ];
      mapped = builtins.concatStringsSep "." (map toString (byte (at 6) ++ byte (at 7)));
      canonical = canonicalIPv6 groups;
    in
    # Mapped first: a socket bound or connected to ::ffff:a.b.c.d uses a.b.c.d, whatever class that is.
    if builtins.genList at 5 == builtins.genList (_: 0) 5 && at 5 == 65535 then
      refused "is an IPv4-mapped IPv6 address, ${mapped} in disguise" mapped "the IPv4 address itself, if it is the host's"
    else if groups == builtins.genList (_: 0) 8 then
      notReachable "a wildcard (unspecified)"
    else if groups == builtins.genList (_: 0) 7 ++ [ 1 ] then
      notReachable "a loopback"
    else if at 0 < 256 then
      unusable "a reserved (::/8: IPv4-compatible or unassigned)" "it is reserved space, not an address a host is given"
    else if at 0 >= 65152 && at 0 <= 65215 then
      unusable "a link-local (fe80::/10)" "it cannot be bound or reached without a zone ID"
    else if at 0 >= 65216 && at 0 <= 65279 then
      unusable "a (deprecated) site-local (fec0::/10)" "RFC 3879 deprecated it"
    else if at 0 >= 65280 then
      unusable "a multicast (ff00::/8)" "it names a group, not a host"
    else if text != canonical then
      refused "is not in canonical form; the firewall rules and the other hosts carry it as written" canonical
        "lower case, no leading zeros, the longest run of zero groups as ::"
    else
      null;

  # null when `value` may be a cluster address, else { reason, suggestion, fix }.
  addressProblem =
    value:
    let
      groups = ipv6Groups value;
    in
    if value == null then
      routable "is not set"
    else if !builtins.isString value then
      routable "is not a string"
    else if contains "%" value then
      routable "has a zone ID (the part from %); other hosts cannot reach an address by this host's interface, and nftables refuses it"
    else if matches ipv4Regex value then
      ipv4Problem value
    else if groups != null then
      ipv6Problem value groups
    else
      routable "is not an IP address (a dotted quad of 0-255 without leading zeros, or an IPv6 address); the firewall rules need an address, not a name";

in
{
  inherit addressProblem canonicalIPv6 ipv6Groups ipv4Regex ipv6Regex;

  # What an emitter requires of an address: the guard regex and the rule, both.
  valid = a: (matches ipv4Regex a || matches ipv6Regex a) && addressProblem a == null;
  isIPv6 = a: builtins.isString a && contains ":" a;
}
