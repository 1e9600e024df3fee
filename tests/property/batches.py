"""The consumers outside Python, run once over every accepted example of the session (one systemd root, one
`systemd --test`, one throwaway root for all plans, one promtool call per file kind), then told apart per
example: example key -> the consumer's complaints about that example's files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.property.consumers import nft, promtool, shell, systemd
from tests.property.outputs import Example, HostOutput

Failures = dict[str, list[str]]  # example key -> complaints


def key(example: Example, host: HostOutput) -> str:
    return f"{example.case.id} = {example.value!r}"[:400] + (f" (host {host.host})" if host.host else "") + \
        f" [{example.name}]"


def _pairs(examples: Iterable[Example]) -> list[tuple[str, Example, HostOutput]]:
    return [(key(e, h), e, h) for e in representatives(examples) for h in e.hosts]


# What a value holds that some consumer reads specially; two values of one field that hold the same of these
# exercise a consumer the same way, so the batches take one of them (the in-process checks took all).
_CLASSES = {
    "quote": "'\"`", "shell": ";&|<>()*?[]~!", "dollar": "$", "percent": "%", "backslash": "\\",
    "space": " \t", "brace": "{}#", "colon": ":,=@+", "dash": "-",
}
MAX_PER_FIELD = 8  # signatures of strings per field
MAX_NUMBERS = 3  # numbers per field: a number reaches every consumer as the same kind of numeral


def _signature(value: object) -> tuple:
    if not isinstance(value, str):
        return (type(value).__name__,)
    return (tuple(name for name, chars in _CLASSES.items() if any(c in value for c in chars)),
            value[:1] in "-+@!:", value != value.strip(), any(ord(c) > 127 for c in value), len(value) > 1000,
            "%" in value and ":" in value,  # a scope ID on an IPv6 address
            next((root for root in _SANDBOXED if value.startswith(root)), None))


# Where a unit's sandbox hides or changes the filesystem: a path under each is its own kind of value.
_SANDBOXED = ("/tmp/", "/var/tmp/", "/dev/shm/", "/home/", "/root/", "/run/user/")


def representatives(examples: Iterable[Example]) -> list[Example]:
    """Per field, the first example of each signature (up to MAX_PER_FIELD), or its first MAX_NUMBERS numbers:
    the consumers outside Python are the tier's slow part."""
    chosen: list[Example] = []
    seen: dict[str, set[tuple]] = {}
    for example in examples:
        own = seen.setdefault(example.case.id, set())
        signature = _signature(example.value) + ((repr(example.value),) if not isinstance(example.value, str) else ())
        limit = MAX_PER_FIELD if isinstance(example.value, str) else MAX_NUMBERS
        # A path a sandbox hides and an address with a scope ID are known failure classes: never capped away.
        must = isinstance(example.value, str) and (signature[-1] is not None or signature[-2])
        if signature not in own and (len(own) < limit or must):
            own.add(signature)
            chosen.append(example)
    return chosen


Pair = tuple[str, Example, HostOutput]


def _tool_clash(tools: set[str], taken: set[str]) -> bool:
    """Two stubs cannot both exist when one path is a directory on the other's way (/opt/x and /opt/x/bin/y)."""
    return any(a.startswith(f"{b}/") or b.startswith(f"{a}/") for a in tools for b in taken)


def _groups(pairs: list[Pair], names: Callable[[Pair], set[str]],
            tools: Callable[[Pair], set[str]]) -> list[list[Pair]]:
    """Groups in which no two examples render a file of the same name (a deployment's own `name` field can give
    two examples one name) or need clashing stubs (a tool path field can name a directory of another's)."""
    groups: list[tuple[set[str], set[str], list[Pair]]] = []
    for pair in pairs:
        own_names, own_tools = names(pair), {os.path.normpath(t) for t in tools(pair)}
        for used, stubs, members in groups:
            if not used & own_names and not _tool_clash(own_tools, stubs):
                used |= own_names
                stubs |= own_tools
                members.append(pair)
                break
        else:
            groups.append((set(own_names), set(own_tools), [pair]))
    return [members for _, _, members in groups]


def _unit_batches(pairs: list[Pair]) -> list[list[Pair]]:
    return _groups(pairs, lambda p: set(p[2].plan["units"]), lambda p: _executables(p[1], p[2]))


def _plan_tools(host: HostOutput) -> set[str]:
    return {role["argv"][0] for role in host.plan["roles"].values()}


def _executables(example: Example, host: HostOutput) -> set[str]:
    deployment = json.loads(host.files[f"pdserve-{example.name}.json"])
    return {role["argv"][0] for role in host.plan["roles"].values()} | {deployment["tools"]["pdserve"]}


def systemd_verify(examples: Iterable[Example], work: Path) -> Failures:
    failures: Failures = {}
    for n, batch in enumerate(_unit_batches(_pairs(examples))):
        units = {name: text for _, _, h in batch for name, text in h.plan["units"].items()}
        tools = {tool for _, e, h in batch for tool in _executables(e, h)}
        code, lines = systemd.verify(units, tools, work / f"verify-{n}")
        for pair_key, _, host in batch:
            own = [line for line in lines if any(name in line for name in host.plan["units"])]
            if own:
                failures[pair_key] = own
        unexplained = [line for line in lines if not any(name in line for _, _, h in batch for name in h.plan["units"])]
        if unexplained or (code != 0 and not lines):
            # A complaint that names no unit: check each example alone to find whose it is.
            for pair_key, example, host in batch:
                alone_code, alone = systemd.verify(host.plan["units"], _executables(example, host),
                                                   work / f"verify-{n}-{len(failures)}-{abs(hash(pair_key))}")
                if alone or alone_code != 0:
                    failures[pair_key] = alone or [f"systemd-analyze verify exited {alone_code}"]
    return failures


def systemd_read_back(examples: Iterable[Example]) -> Failures:
    """systemd's own parse of each unit gives back plan --json's argv and environment exactly."""
    failures: Failures = {}
    for batch in _unit_batches(_pairs(examples)):
        parsed = systemd.read_back({name: text for _, _, h in batch for name, text in h.plan["units"].items()})
        for pair_key, example, host in batch:
            found = _compare_units(example, host, parsed)
            if found:
                failures[pair_key] = found
    return failures


def _compare_units(example: Example, host: HostOutput, parsed: dict[str, systemd.ParsedUnit]) -> list[str]:
    found = []
    deployment = json.loads(host.files[f"pdserve-{example.name}.json"])
    for role in host.plan["roles"].values():
        name = f"{role['unit']}.service"
        unit = parsed.get(name)
        if unit is None:
            found.append(f"{name}: systemd did not load it")
            continue
        starts = unit.commands.get("ExecStart", [])
        if starts != [role["argv"]]:
            found.append(f"{name}: systemd reads ExecStart= as {starts!r}, plan --json says {[role['argv']]!r}")
        line = next(line for line in host.plan["units"][name].split("\n") if line.startswith("ExecStart="))
        if any("$" in arg for arg in role["argv"]) and ":" not in line.split("=", 1)[1].split("/", 1)[0]:
            found.append(f"{name}: an argument holds $ but ExecStart= lacks the ':' prefix "
                         "(systemd expands it at exec)")
        environment = dict(item.split("=", 1) for item in unit.properties.get("Environment", []))
        for variable, value in role["env"].items():
            if environment.get(variable) != value:
                found.append(f"{name}: systemd reads {variable}={environment.get(variable)!r}, "
                             f"plan --json says {value!r}")
        for prop, want in (("User", deployment["systemd"]["user"]), ("Group", deployment["systemd"]["group"])):
            if unit.properties.get(prop) != [want]:
                found.append(f"{name}: systemd reads {prop}={unit.properties.get(prop)!r}, "
                             f"the deployment says {want!r}")
        for command, lines in unit.commands.items():
            for argv in lines:
                for path in _opened_paths(argv):
                    why = _hidden(path, unit.properties)
                    if why:
                        found.append(f"{name}: {command}= needs {path!r}, which {why}")
        stop = systemd.seconds(unit.properties["TimeoutStopSec"][0])
        if stop != deployment["systemd"]["stop_timeout_sec"]:
            found.append(f"{name}: systemd reads TimeoutStopSec={stop}, the deployment says "
                         f"{deployment['systemd']['stop_timeout_sec']}")
    return found


# Flags whose value SGLang opens as a file or directory (sglang 0.5.23 server_args).
_PATH_FLAGS = ("--model-path", "--chat-template", "--tokenizer-path", "--config")


def _opened_paths(argv: list[str]) -> list[str]:
    """The files a command line makes its process open: the executable, the program numactl runs (after
    --), a Python script, and the values of path flags, where they are absolute paths."""
    found = [argv[0]]
    for i, arg in enumerate(argv[1:], start=1):
        if argv[i - 1] == "--" or arg.endswith(".py") or argv[i - 1] in _PATH_FLAGS:
            found.append(arg)
    return [path for path in found if path.startswith("/")]


def _hidden(path: str, properties: dict[str, list[str]]) -> str | None:
    """Why the unit's own mount namespace (as systemd parsed its sandbox) does not show `path` (None: it does)."""
    def under(*roots: str) -> bool:
        return any(path == root or path.startswith(f"{root}/") for root in roots)
    if properties.get("PrivateTmp") == ["yes"] and under("/tmp", "/var/tmp"):
        return "PrivateTmp=yes hides from the unit (it gets an empty /tmp and /var/tmp)"
    if properties.get("ProtectHome", ["no"])[0] in ("yes", "tmpfs") and under("/home", "/root", "/run/user"):
        return f"ProtectHome={properties['ProtectHome'][0]} hides from the unit"
    # systemd's private /dev (namespace.c, mount_private_dev) holds the API devices and binds the host's
    # /dev/pts, /dev/shm, /dev/mqueue and /dev/hugepages into it: only the rest of /dev is hidden.
    if properties.get("PrivateDevices") == ["yes"] and under("/dev") and \
            not under("/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/hugepages"):
        return "PrivateDevices=yes hides from the unit (it gets its own /dev)"
    return None


def plans(examples: Iterable[Example], work: Path) -> Failures:
    """bash -n, sh -n, and a run of each plan against recording stubs: each command records plan --json's
    argv and the role's environment, the here-documents write the files, nothing else happens."""
    failures: Failures = {}
    pairs = _pairs(examples)
    runs: dict[str, shell.Run] = {}
    for n, group in enumerate(_groups(pairs, lambda p: {p[0]}, lambda p: _plan_tools(p[2]))):
        runs.update(shell.run_plans({k: h.plan_text for k, _, h in group},
                                    {t for _, _, h in group for t in _plan_tools(h)}, work / f"plans-{n}"))
    for pair_key, _, host in pairs:
        found = _compare_run(host, runs[pair_key])
        if found:
            failures.setdefault(pair_key, []).extend(found)
    return failures


def _compare_run(host: HostOutput, run: shell.Run) -> list[str]:
    found = [f"{sh} -n: {complaint[-500:]}" for sh, complaint in run.syntax.items() if complaint]
    if run.rc != "0" or run.stderr.strip():
        found.append(f"the plan exited {run.rc}: {run.stderr.strip()[-500:]}")
    roles = list(host.plan["roles"].values())
    if [call.argv for call in run.calls] != [role["argv"] for role in roles]:
        found.append(f"the plan ran {[c.argv for c in run.calls]!r}"[:1500] + f", plan --json says "
                     f"{[r['argv'] for r in roles]!r}"[:1500])
    for call, role in zip(run.calls, roles, strict=False):
        wrong = {k: call.env.get(k) for k, v in role["env"].items() if call.env.get(k) != v}
        if wrong:
            found.append(f"{role['unit']}: the plan's command passed {wrong!r}"[:1500])
    documents = dict(host.plan["units"])
    if host.plan.get("firewall"):
        documents[f"pdserve-{host.plan['deployment']}-firewall.nft"] = host.plan["firewall"]
    if run.files != documents:
        extra = sorted(set(run.files) ^ set(documents))
        differ = sorted(n for n in set(run.files) & set(documents) if run.files[n] != documents[n])
        found.append(f"the plan wrote other files than plan --json's: extra/missing {extra}, different {differ}")
    return found


def rulesets(examples: Iterable[Example], work: Path) -> Failures:
    failures: Failures = {}
    owners = {host.out / name: pair_key for pair_key, _, host in _pairs(examples)
              for name in host.files if name.endswith("-firewall.nft")}
    for path, complaint in nft.check_all(list(owners), work).items():
        failures.setdefault(owners[path], []).append(f"nft -c -f {path.name}: {complaint}")
    return failures


def prometheus(examples: Iterable[Example]) -> Failures:
    failures: Failures = {}
    owners: dict[Path, str] = {}
    for pair_key, _, host in _pairs(examples):
        for name in host.files:
            if name.endswith(("monitoring/prometheus.yml", "monitoring/alerts.yml")):
                owners[host.out / name] = pair_key
    for kind, suffix in (("config", "prometheus.yml"), ("rules", "alerts.yml")):
        refused = promtool.check(kind, [path for path in owners if path.name == suffix])
        for path, complaint in refused.items():
            failures.setdefault(owners[path], []).append(f"promtool check {kind} {suffix}: {complaint}")
    return failures
