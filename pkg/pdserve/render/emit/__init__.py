"""One emitter per target language: every deployment value reaches a rendered file through its language's
emitter, which quotes it by that language's rules or refuses it.

- `nft`: nftables rulesets (pdserve.render.firewall);
- `prometheus`: scrape targets, label names, PromQL strings and the YAML/JSON files Prometheus and Grafana read
  (pdserve.render.monitoring);
- `shell`: POSIX shell words, assignments, comments and here-documents (pdserve.render.plan).
systemd's is pdserve.schema.systemd_syntax (read by pdserve.render.units), where the schema also checks values.

A refusal raises EmitError. `pdserve check` refuses every such value first (pdserve.schema.addresses and the
field validators), so an EmitError is a bug between the schema and a renderer, never a user's input to fix.
"""

from __future__ import annotations


class EmitError(ValueError):
    """A value its target language cannot carry exactly; `check` should have refused it."""
