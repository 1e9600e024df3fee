"""The Prometheus emitter: scrape targets, label names and values, PromQL strings, alert templates, and
the YAML/JSON documents Prometheus and Grafana read, written by a serializer, never by pasting strings.

- A target is exactly `host:port` (Prometheus' static_configs): an IP literal (IPv6 in brackets, no zone
  ID) or a host name, and a port.
- A document is JSON (Prometheus reads YAML, and JSON is YAML) with no NaN or Infinity, and any character
  YAML does not allow raw (controls, U+FEFF, U+FFFE/U+FFFF) escaped; a lone surrogate is refused.
- A PromQL string literal escapes `\\`, `"` and non-printable characters the Go way.
- Alert annotations are Go templates: a value is put in as a template string literal, so `{{` in it is
  text, not template code.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from pdserve.render.emit import EmitError
from pdserve.render.emit.text import shown
from pdserve.schema.addresses import listen_host_problem, parse_ip

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def target(host: str, port: int) -> str:
    """`host:port` for static_configs' targets."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise EmitError(f"prometheus: {port!r} is not a port")
    literal = parse_ip(host)
    if literal is not None:
        if literal.zone is not None or literal.canonical != host:
            raise EmitError(f"prometheus: {host!r} is not a plain canonical IP address")
        return f"[{host}]:{port}" if literal.ip.version == 6 else f"{host}:{port}"
    if listen_host_problem(host) is not None:
        raise EmitError(f"prometheus: {host!r} is neither an IP address nor a host name")
    return f"{host}:{port}"


def label_name(name: str) -> str:
    if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
        raise EmitError(f"prometheus: {name!r} is not a label name (and __ names are Prometheus' own)")
    return name


def labels(values: dict[str, str]) -> dict[str, str]:
    """A label set: valid names; any UTF-8 value (the document's serializer quotes it)."""
    for name, value in values.items():
        label_name(name)
        _encodable(value)
    return dict(values)


def _encodable(value: str) -> str:
    if any(unicodedata.category(c) == "Cs" for c in value):
        raise EmitError(f"prometheus: {shown(value)!r} holds a lone surrogate, which UTF-8 cannot carry")
    return value


_GO_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding exactly `value`."""
    out = []
    for char in _encodable(value):
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cf") or char in "\ufffe\uffff":
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def matcher(name: str, value: str) -> str:
    """`name="value"` inside a PromQL selector."""
    return f"{label_name(name)}={promql_string(value)}"


def template_text(value: str) -> str:
    """`value` as literal text inside a Go template (alert annotations): a template string action, so
    `{{`, `}}` and `$` in it print as themselves."""
    if "{" in value or "}" in value:  # a lone brace too: it could meet the template's own braces
        return "{{ " + promql_string(value) + " }}"
    return _encodable(value)


# What YAML does not read back as itself when raw in a quoted scalar: DEL and the C1 controls (not printable),
# NEL, U+2028 and U+2029 (line breaks to YAML 1.1, which folds them), the BOM and U+FFFE/U+FFFF. JSON's own
# escaping covers the C0 controls already.
_NOT_YAML_PRINTABLE = re.compile("[\x7f-\x9f\ufeff\ufffe\uffff\u2028\u2029]")


def document(data: Any, comment: str | None = None) -> str:
    """`data` as a JSON document that YAML reads the same (Prometheus' files), with `comment` as a YAML
    comment line above it, or with none for a JSON reader (Grafana's dashboard)."""
    try:
        text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise EmitError(f"prometheus: {exc}") from None
    _encodable(text)
    head = f"# {shown(comment)}\n" if comment is not None else ""
    return _NOT_YAML_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", head + text) + "\n"
