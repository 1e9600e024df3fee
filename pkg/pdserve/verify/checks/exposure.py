"""Workers reachable only on loopback; the router's API key enforced when one is configured."""

from __future__ import annotations

from pdserve.probes.observations import AuthObs, PortProbe
from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed, skipped, warned

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def _nothing_listens(probes: list[PortProbe]) -> str:
    tried = ", ".join(f"{p.what} {p.address}:{p.port}" for p in probes) or "no port"
    return (f"no server of the deployment listens here ({tried}: none accepts a connection), so there is no "
            "exposure to test; run it where the servers run, once they are up")


def check_ports(exp: Expectations, addresses: list[str], probes: list[PortProbe],
                listening: list[PortProbe]) -> CheckResult:
    """exp: this host's workers. On one host they listen on loopback; on several, each listens on its host's
    cluster address (where the router and its peers reach it; the firewall decides who may) and nowhere else.
    `listening`: each worker port tried at its own listen address: a port nothing listens on is no proof that
    it is closed beyond loopback, so with none of them up the check skips rather than passes."""
    cid = "exposure.ports"
    if exp.multi_host:
        return _check_cluster_ports(exp, addresses, probes)
    expected = "worker and bootstrap ports refuse connections on every non-loopback address"
    if not addresses:
        return skipped(cid, "this host has no non-loopback address to test from", expected)
    if not any(p.reachable for p in listening):
        return skipped(cid, _nothing_listens(listening), expected)
    open_ = [p for p in probes if p.reachable]
    observed = (f"tried {len(probes)} address:port pairs on {', '.join(addresses)}; "
                + (", ".join(f"{p.what} open on {p.address}:{p.port}" for p in open_) or "none reachable"))
    if not open_:
        return passed(cid, observed, expected)
    allowed = {w.port for w in exp.workers.values() if w.allow_non_loopback}
    if any(w.role == "prefill" and w.allow_non_loopback for w in exp.workers.values()):
        allowed.add(exp.bootstrap_port)
    unexpected = [p for p in open_ if p.port not in allowed]
    if unexpected:
        return failed(cid, observed, expected,
                      "workers bypass the router's API key and must listen on 127.0.0.1: set prefill.host/decode.host "
                      "to 127.0.0.1, re-render and restart the workers; firewall the ports meanwhile",
                      [f"{p.what} {p.port} reachable at {p.address}" for p in unexpected])
    return warned(cid, observed, expected,
                  "allow_non_loopback is set: anyone who reaches these ports bypasses the router's API key; "
                  "restrict them with a firewall")


def _check_cluster_ports(exp: Expectations, addresses: list[str], probes: list[PortProbe]) -> CheckResult:
    cid = "exposure.ports"
    expected = ("worker and bootstrap ports answer on this host's cluster address only (its firewall limits who "
                "reaches them there); every other address refuses")
    if not exp.workers:
        return skipped(cid, "no server runs on this host", expected)
    on_cluster = {(w.host, port) for w in exp.workers.values() for port in (w.port, w.bootstrap_port) if port}
    own = [p for p in probes if (p.address, p.port) in on_cluster]
    if not any(p.reachable for p in own):
        return skipped(cid, _nothing_listens(own), expected)
    open_ = [p for p in probes if p.reachable]
    observed = (f"tried {len(probes)} address:port pairs on {', '.join(addresses) or 'no address'}; "
                + (", ".join(f"{p.what} open on {p.address}:{p.port}" for p in open_) or "none reachable"))
    elsewhere = [p for p in open_ if (p.address, p.port) not in on_cluster]
    if elsewhere:
        return failed(cid, observed, expected,
                      "a server listens on more than its host's cluster address (a wildcard or another interface): "
                      "set its host to the cluster address (or leave it unset: it defaults to it), re-render and "
                      "restart it", [f"{p.what} {p.port} reachable at {p.address}" for p in elsewhere])
    return passed(cid, observed, expected)


def check_auth(exp: Expectations, obs: AuthObs | None, key_error: str | None = None) -> CheckResult:
    cid = "exposure.auth"
    if exp.api_key_file is None:
        expected = "no API key configured"
        if exp.router_host in LOOPBACK:
            return skipped(cid, "router.api_key_file is not set and the router listens on loopback only", expected)
        return warned(cid, f"router listens on {exp.router_host} without an API key", "an API key on a public router",
                      "set router.api_key_file to a file holding a key (delivered with LoadCredential=)")
    expected = "without the key: 401; with it: 200"
    if key_error:
        return failed(cid, key_error, expected,
                      f"run the verifier as a user that can read {exp.api_key_file} (e.g. root), "
                      "or pass --api-key-file")
    assert obs is not None
    if obs.error:
        return failed(cid, f"request failed: {obs.error}", expected,
                      f"the router did not answer: `journalctl -u {exp.router_unit}`")
    observed = f"without the key: {obs.without_key}; with it: {obs.with_key}"
    if obs.without_key != 401:
        return failed(cid, observed, expected,
                      "the router serves clients without the key: it was started without --api-key; start it through "
                      f"pdserve's keyed launcher (the rendered unit does, with LoadCredential=) and restart "
                      f"{exp.router_unit}")
    if obs.with_key != 200:
        return failed(cid, observed, expected,
                      f"the router rejects the key in {exp.api_key_file}: the file changed since the router started; "
                      f"`systemctl restart {exp.router_unit}`")
    return passed(cid, observed, expected)
