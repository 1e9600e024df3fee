"""How SGLang's and the router's parsers read a flag in extra_args. Pure.

Both parsers are plain argparse with allow_abbrev=True (sglang 0.5.23 `prepare_server_args`,
smg 1.13.0 `parse_router_args`), so `--por 1` sets --port and `--api=K` sets --api-key: an
unambiguous prefix of a long option is that option, `--flag=value` included. A prefix of several
options is an error in the parser itself. So an extra argument that is a rendered or secret flag *or a
prefix of one* is either read as that flag or refused by the parser; pdserve refuses it up front.
tests/integration/test_hostile_parsers.py holds this reading against the real parsers.
"""

from __future__ import annotations

from collections.abc import Iterable

# Flags whose value is a secret: on a command line it is visible to every user through ps.
SERVER_SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
# smg adds per-tenant keys (--tenant-api-key TENANT:KEY) beside --api-key.
ROUTER_SECRET_FLAGS = ("--api-key", "--tenant-api-key", "--control-plane-api-keys", "--oracle-password")
# Real flags of the pinned versions that are also prefixes of a guarded flag: argparse takes an exact
# name before any abbreviation, so these mean themselves (--ssl-keyfile is not --ssl-keyfile-password).
# tests/integration/test_hostile_parsers.py finds every such flag of the real parsers.
SERVER_EXACT_FLAGS = ("--ssl-keyfile",)
ROUTER_EXACT_FLAGS: tuple[str, ...] = ()


def long_flag(arg: str) -> str | None:
    """The option part of `arg` as argparse sees it (`--name` of `--name=value`), or None."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg.split("=", 1)[0]


def read_as(arg: str, flags: Iterable[str], exact: Iterable[str] = ()) -> str | None:
    """The flag among `flags` that the parser may take `arg` for: itself, or one it abbreviates.
    `exact` lists other real flags, which the parser takes as themselves."""
    flag = long_flag(arg)
    if flag is None:
        return None
    known = sorted(flags)
    if flag in known:
        return flag
    if flag in exact:
        return None
    return next((f for f in known if f.startswith(flag)), None)


def secret_flag(arg: str, secrets: Iterable[str], exact: Iterable[str] = ()) -> str | None:
    return read_as(arg, secrets, exact)
