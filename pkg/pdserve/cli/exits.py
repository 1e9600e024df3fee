"""The exit codes of every pdserve command: one table, printed by `pdserve --help` and docs/commands.md."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    # The deployment file has problems, or what was checked is not right (a failed check, a refused
    # or rolled-back cutover, a readiness gate whose deadline passed).
    PROBLEMS = 1
    # The command line itself is wrong (unknown option or check id, a missing argument): click's own.
    USAGE = 2
    # pdserve itself failed (a check crashed, a cutover's rollback failed too): never reported as a pass.
    INTERNAL = 3
    # The host could not be observed, so nothing can be said (a dry run without systemd).
    UNKNOWN = 4


TABLE = (
    (Exit.OK, "success: the file is valid, the checks passed, the cutover completed"),
    (Exit.PROBLEMS, "problems: the deployment file is invalid (every command), a check failed, a cutover was "
                    "refused or rolled back, a unit was not ready in time"),
    (Exit.USAGE, "usage: the command line is wrong (unknown option, check id or missing argument)"),
    (Exit.INTERNAL, "pdserve itself failed (a check crashed, a cutover's rollback failed too); never a pass"),
    (Exit.UNKNOWN, "state unknown: the host could not be observed (e.g. a dry run without systemd)"),
)


def help_epilog() -> str:
    """The table for `pdserve --help`; click keeps a paragraph after a lone \\b line as written."""
    rows = "\n".join(f"  {int(code)}  {meaning}" for code, meaning in TABLE)
    return f"Exit codes, the same for every command:\n\n\b\n{rows}"
