"""Every string and number field of the deployment, found by walking its JSON Schema (`pdserve schema`), and
placed in the base documents the tier mutates: the single-host reference (hosts/gpu-host, the embedded
default profile) and the four-host example (hosts/four-host: several prefill servers, a multi-node decode
server, a router host).

A field is a location in a document: a value (`prefill[0].port`), a list item (`prefill.gpus[0]`), a table
value (`environment.NCCL_DEBUG`) or a table key (the name of an environment variable, of a host). Walking
the schema rather than listing fields means a field added to the schema is covered without touching this
tier.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdserve.schema.loading import default_profile_text, json_schema, parse_document

REPO = Path(__file__).resolve().parents[2]
ITEM, VALUE, KEY = "[]", "{}", "{key}"  # schema steps: an array item, a table value, a table key

# Every tool is named, so rendering never looks at this machine's PATH and the plan's commands run the
# stubs of tests/property/consumers/shell.py; monitoring is on where it is supported (one host), so every
# example renders the Prometheus files too.
TOOLS = {"sglang_python": "/opt/pdserve-prop/bin/python", "numactl": "/opt/pdserve-prop/bin/numactl",
         "pdserve": "/opt/pdserve-prop/bin/pdserve"}


def _single() -> dict[str, Any]:
    data = parse_document(default_profile_text(), "toml", "<default profile>")
    data["tools"] = dict(TOOLS)
    data["monitoring"] = {"enable": True}
    return data


def _multi() -> dict[str, Any]:
    data = tomllib.loads((REPO / "hosts/four-host/deployment.toml").read_text(encoding="utf-8"))
    data["tools"] = dict(TOOLS)
    return data


BASES = {"single": _single(), "multi": _multi()}


@dataclass(frozen=True)
class Leaf:
    """A string or number in the schema: its steps from the document's root, and its own schema."""

    steps: tuple[str, ...]
    kind: str  # "string", "integer" or "number"
    schema: dict[str, Any] = field(hash=False, compare=False)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    return node


def _walk(node: dict[str, Any], defs: dict[str, Any], steps: tuple[str, ...]) -> Iterator[Leaf]:
    node = _resolve(node, defs)
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        yield from _walk(branch, defs, steps)
    kind = node.get("type")
    if kind in ("string", "integer", "number") or (("enum" in node or "const" in node) and kind is None):
        yield Leaf(steps, kind or "string", node)
    elif kind == "object":
        for name, child in node.get("properties", {}).items():
            yield from _walk(child, defs, (*steps, name))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            yield Leaf((*steps, KEY), "string", {"type": "string"})
            yield from _walk(extra, defs, (*steps, VALUE))
    elif kind == "array" and isinstance(node.get("items"), dict):
        yield from _walk(node["items"], defs, (*steps, ITEM))


def leaves() -> list[Leaf]:
    schema = json_schema()
    found: dict[tuple[str, ...], Leaf] = {}
    for leaf in _walk(schema, schema["$defs"], ()):
        found.setdefault(leaf.steps, leaf)  # `X | None` and a oneOf branch name the same location twice
    return list(found.values())


@dataclass(frozen=True)
class FieldCase:
    """One field of one base document: where to put a value, and how pdserve names the field."""

    base: str
    location: tuple[Any, ...]  # keys and indices in the document; the last may be KEY_OF(name)
    kind: str
    schema: dict[str, Any] = field(hash=False, compare=False)

    @property
    def renames_key(self) -> bool:
        return isinstance(self.location[-1], KeyOf)

    @property
    def name(self) -> str:
        """The field as pdserve's problems name it: prefill[0].port, prefill.gpus[0], environment.NCCL_DEBUG,
        hosts.gpu-a.address; a key by its table (environment, hosts)."""
        text = ""
        for part in self.location:
            if isinstance(part, KeyOf):
                break
            if isinstance(part, int):
                text += f"[{part}]"
            else:
                text += f".{part}" if text else str(part)
        return text

    @property
    def id(self) -> str:
        what = f"{self.name}<key {self.location[-1].name}>" if self.renames_key else self.name
        return f"{self.base}:{what}"

    def original(self) -> Any:
        """The base document's value at this location (None where the base leaves it unset)."""
        if self.renames_key:
            return self.location[-1].name
        node: Any = BASES[self.base]
        for part in self.location:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return None
        return node


@dataclass(frozen=True)
class KeyOf:
    """The last step of a location that renames a table's key (the table's entry keeps its value)."""

    name: str


# Where the layouts differ: a single-host file has one [prefill] table, a fallback and no [hosts]; a
# multi-host file places [[prefill]] servers on [hosts] and has no fallback. A field of the other layout
# would only be refused for the layout, which tells nothing about its values.
_ONLY_MULTI = ("hosts",)
_ONLY_SINGLE = ("fallback",)
# Tables whose entries the base leaves empty: the tier adds one entry to mutate.
_NEW_ENTRY = "PDSERVE_PROP"


def _place(leaf: Leaf, base: str, data: dict[str, Any]) -> tuple[Any, ...] | None:
    steps = leaf.steps
    if base == "single" and (steps[0] in _ONLY_MULTI or steps[:2] == ("router", "hosts")):
        return None
    if base == "multi" and steps[0] in _ONLY_SINGLE:
        return None
    location: list[Any] = []
    node: Any = data
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if step == ITEM:
            if not isinstance(node, list):
                # A single-host [prefill] table has no servers array (and vice versa).
                if node is not None or (steps[0] in ("prefill", "decode") and i == 1):
                    return None
                node = None
            location.append(0)
            node = node[0] if node else None
        elif step in (VALUE, KEY):
            if node is not None and not isinstance(node, dict):
                return None
            key = next(iter(node), _NEW_ENTRY) if node else _NEW_ENTRY
            if steps[0] == "hosts" and data.get("router", {}).get("hosts"):
                # The router's host: its address is a source in other hosts' rulesets and in every worker URL.
                key = data["router"]["hosts"][0]
            location.append(KeyOf(key) if step == KEY else key)
            node = node.get(key) if node else None
        else:
            if isinstance(node, list):
                return None  # a table's field where the base holds an array (the other layout's shape)
            location.append(step)
            node = node.get(step) if isinstance(node, dict) else None
        if last:
            return tuple(location)
    return tuple(location)


def field_cases() -> list[FieldCase]:
    cases = []
    for base, data in BASES.items():
        for leaf in leaves():
            location = _place(leaf, base, data)
            if location is not None:
                cases.append(FieldCase(base, location, leaf.kind, leaf.schema))
    return cases


def mutated(case: FieldCase, value: Any, name: str | None) -> dict[str, Any]:
    """A copy of the case's base document with `value` at its location; named `name` (so that many
    examples' units can share one systemd root) unless the case is the deployment's name itself."""
    data = copy.deepcopy(BASES[case.base])
    if name is not None and case.location != ("name",):
        data["name"] = name
    if case.location == ("tools", "sglang_venv"):
        data["tools"].pop("sglang_python")  # the two name one Python: beside each other they are refused
    *parents, last = case.location
    node: Any = data
    for part, following in zip(parents, [*parents[1:], last][:len(parents)], strict=True):
        if isinstance(node, list):
            while len(node) <= part:
                node.append({} if not isinstance(following, int) else [])
            node = node[part]
            continue
        if node.get(part) is None:
            node[part] = [] if isinstance(following, int) else {}
        node = node[part]
    if isinstance(last, KeyOf):
        node[value] = node.pop(last.name, "1")
        if parents == ["hosts"]:  # a host's name: every placement that names it follows
            _rename_host(data, last.name, value)
    elif isinstance(node, list):
        while len(node) <= last:
            node.append(value)
        node[last] = value
    else:
        node[last] = value
    return data


def _rename_host(data: dict[str, Any], old: str, new: Any) -> None:
    for role in ("prefill", "decode"):
        for server in data.get(role, []):
            server["hosts"] = [new if h == old else h for h in server.get("hosts", [])]
    router = data.get("router", {})
    router["hosts"] = [new if h == old else h for h in router.get("hosts", [])]
