"""Field types of the deployment schema: one-field validators and bounds, each error with its fix.

Every string that can reach a unit file, argv or environment is checked here against systemd's own
rules (pdserve.schema.systemd_syntax), so a bad value is refused when the file is read, not when the
unit is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from pdserve.schema import systemd_syntax
from pdserve.schema.addresses import listen_host_problem
from pdserve.schema.extra_args import (
    ROUTER_EXACT_FLAGS,
    ROUTER_SECRET_FLAGS,
    SERVER_EXACT_FLAGS,
    SERVER_SECRET_FLAGS,
    secret_flag,
)


def invalid(message: str, fix: str) -> PydanticCustomError:
    # The fix travels in the error's context, so the loader can print it beside the message. Either may quote
    # the value, and pydantic's errors() cannot encode a lone surrogate (it ends in a UnicodeEncodeError, not
    # a problem line): such characters are written as their escapes.
    return PydanticCustomError("pdserve", _encodable(message), {"fix": _encodable(fix)})


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _absolute_path(value: str) -> str:
    if not PurePosixPath(value).is_absolute():
        raise invalid("must be an absolute path", f"write the full path, e.g. /var/lib/pdserve/{value.lstrip('./~')}")
    return value


def dotted_path_problem(path: str) -> str | None:
    """'.', '..' or empty components in an absolute path: `/tmp/../opt` names /opt only while /tmp is no
    link, and `//x`, `/x/` hide what runs. Refused rather than normalized, so the path in the file is the
    path checked against the units' sandbox (pdserve.render.reach) and the path that runs."""
    if path != "/" and any(part in {"", ".", ".."} for part in path.split("/")[1:]):
        return "has '.', '..', '//' or a trailing '/' in it"
    return None


def _plain(value: str) -> str:
    problem = dotted_path_problem(value)
    if problem:
        raise invalid(problem, "write the plain absolute path, e.g. /opt/sglang instead of /opt/x/../sglang/")
    return value


AbsolutePath = Annotated[str, AfterValidator(_absolute_path), AfterValidator(_plain)]
Port = Annotated[int, Field(ge=1, le=65535, description="TCP port, 1-65535")]
# systemd reads a time it cannot hold (over 2^64 us) as unparsable and silently keeps its default (90 s
# for TimeoutStartSec=); the router's timers overflow much earlier. No start or stop needs a year.
MAX_SECONDS = 365 * 24 * 3600
Seconds = Annotated[int, Field(ge=1, le=MAX_SECONDS, description=f"seconds, 1-{MAX_SECONDS} (a year)")]
# Counts and sizes SGLang keeps in 32-bit integers; NUMA nodes and GPU indices far below that.
Count = Annotated[int, Field(ge=1, le=2**31 - 1)]
Index = Annotated[int, Field(ge=0, le=4095)]
# List lengths: far above any real deployment, low enough that no unit line nears LONG_LINE_MAX per item.
MAX_LIST_ITEMS = 256


def _refused_by(problem_of: Callable[[str], str | None], fix: str) -> Callable[[str], str]:
    """A validator that refuses a value systemd_syntax finds a problem with, giving `fix`."""

    def check(value: str) -> str:
        problem = problem_of(value)
        if problem:
            raise invalid(problem, fix)
        return value

    return check


_executable = _refused_by(
    lambda path: systemd_syntax.executable_problem(path) or dotted_path_problem(path),
    "give the plain absolute path of the executable, without quotes, backslashes, '.' or '..'")
_user_name = _refused_by(systemd_syntax.user_name_problem, "use an existing system user/group name such as \"pdserve\"")
_unit_name = _refused_by(systemd_syntax.unit_name_problem, "use a target such as \"multi-user.target\"")


_plain_path = _refused_by(systemd_syntax.normalized_path_problem,
                         "write the plain absolute path of the file, e.g. /etc/pdserve/router.key")


def _file_path(value: str) -> str:
    return _plain_path(_absolute_path(value))


def _host(value: str) -> str:
    """A listen address: an IP address or a DNS name (pdserve.schema.addresses.listen_host_problem). It also
    goes into URLs (--prefill http://HOST:PORT) and Prometheus targets (HOST:PORT)."""
    problem = listen_host_problem(value)
    if problem:
        raise invalid(*problem)
    return value


ExecutablePath = Annotated[str, AfterValidator(_executable)]
FilePath = Annotated[str, AfterValidator(_file_path)]
UserName = Annotated[str, AfterValidator(_user_name)]
UnitName = Annotated[str, AfterValidator(_unit_name)]
Host = Annotated[str, AfterValidator(_host), Field(
    description="Listen address: an IPv4 address, an IPv6 address in canonical form (e.g. ::1, 2001:db8::1) or a "
    "lower-case host name; no zone ID (%...), IPv4-mapped, broadcast, multicast or link-local address")]
Fraction = Annotated[
    float,
    Field(gt=0, lt=1, description="fraction of each GPU's memory, strictly between 0 and 1"),
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
UNIT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
IB_DEVICE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


# Which sparse attention decode kernels (DeepSeek V3.2's DSA, V4) an SGLang server runs: SGLang's own, or pdserve's
# (kernels/, through the pdserve-kernels SGLang plugin, which reads DSA_KERNELS_ENV in every scheduler process).
AttentionKernels = Annotated[Literal["sglang", "pdserve"], Field(
    description="DeepSeek V3.2 (DSA) and V4 sparse attention decode kernels: sglang (SGLang's own) or pdserve (the "
    "fused indexer + exact top-k and the sparse MLA decode of pdserve's kernels/, through the pdserve-kernels SGLang "
    "plugin, which the SGLang environment must contain; measure the decode step before switching it on). A shape "
    "pdserve's kernels do not support falls back to SGLang's kernel and says so once in the server's log; "
    "`pdserve verify` reports what each server runs. Rendered as PDSERVE_DSA_KERNELS in the unit's environment")]
DSA_KERNELS_ENV = "PDSERVE_DSA_KERNELS"
# Environment variables pdserve renders from a schema field (variable -> field): one source of truth,
# so a value here can neither override the field nor be silently overridden by it.
RESERVED_ENVIRONMENT = {DSA_KERNELS_ENV: "attention_kernels"}


def _environment(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_LIST_ITEMS:
        raise invalid(f"has {len(value)} variables, more than {MAX_LIST_ITEMS}",
                      "keep the environment to what the servers need")
    for name in value:
        if not _ENV_NAME.fullmatch(name):
            raise invalid(f"{name!r} is not a valid environment variable name", "use letters, digits and _")
        if name in RESERVED_ENVIRONMENT:
            field = RESERVED_ENVIRONMENT[name]
            raise invalid(
                f"{name} is rendered by pdserve from the SGLang servers' {field} field",
                f"remove it here and set {field} = \"pdserve\" (or \"sglang\") on the server instead: "
                f"prefill.{field}, decode.{field}, fallback.{field}",
            )
        if _SECRET_NAME.search(name):
            raise invalid(
                f"{name} looks like a secret, and environment values end up in unit files and the Nix store",
                "put the secret in a file and point router.api_key_file at it (LoadCredential=)",
            )
    return value


Environment = Annotated[dict[str, str], AfterValidator(_environment)]


def _no_secret_flags(value: list[str], secrets: tuple[str, ...], exact: tuple[str, ...]) -> list[str]:
    for arg in value:
        flag = secret_flag(arg, secrets, exact)
        if flag:
            raise invalid(
                f"{arg.split('=', 1)[0]} is read by the parser as {flag}; a secret on a command line is visible "
                "to every user through ps",
                "remove it and set router.api_key_file to a file holding the key",
            )
    return value


def _server_extra_args(value: list[str]) -> list[str]:
    return _no_secret_flags(value, SERVER_SECRET_FLAGS, SERVER_EXACT_FLAGS)


def _router_extra_args(value: list[str]) -> list[str]:
    return _no_secret_flags(value, ROUTER_SECRET_FLAGS, ROUTER_EXACT_FLAGS)


ExtraArgs = Annotated[list[str], AfterValidator(_server_extra_args), Field(max_length=MAX_LIST_ITEMS)]
RouterExtraArgs = Annotated[list[str], AfterValidator(_router_extra_args), Field(max_length=MAX_LIST_ITEMS)]
