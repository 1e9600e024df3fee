"""The POSIX shell emitter: words, assignments, comments and here-documents of the shell `pdserve plan`
prints.

- A word is quoted with shlex.quote: the shell reads it back as exactly the value.
- An assignment's name is a shell variable name; its value a quoted word.
- A command's environment goes through env(1) (`env NAME=value ... program args`), so a pasted command runs
  with it as the unit would: a bare `NAME=value` line sets a shell variable that no command below it sees.
- A comment shows every line break and control character escaped, so no value ends it and starts a command.
- A here-document's terminator is chosen so that no line of its body equals it, and is quoted (`<<'END'`),
  so the body is neither expanded nor ended early by any value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from pdserve.render.emit import EmitError
from pdserve.render.emit.text import shown

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TERMINATOR = re.compile(r"[A-Z][A-Z0-9_]*")


def word(value: str) -> str:
    if "\0" in value:
        raise EmitError("shell: a NUL byte cannot be carried in a shell word")
    return shlex.quote(value)


def assignment(name: str, value: str) -> str:
    """`NAME=value` as the shell reads it (no command, so no expansion of the value beyond its quotes)."""
    if not _NAME.fullmatch(name):
        raise EmitError(f"shell: {name!r} is not a variable name")
    return f"{name}={word(value)}"


# env(1) reads every word holding `=` before the program as one more assignment: a program whose path holds
# one is started through sh, which takes it as a word. /bin/sh by its path, since the environment may set PATH.
_EXEC_AS_GIVEN = ("/bin/sh", "-c", 'exec "$0" "$@"')


def environment_prefix(env: Mapping[str, str], program: str) -> list[str]:
    """The shell words that, put before `program` and its arguments, run it with `env` added to the caller's
    environment: `env NAME=value ...`. Not the shell's own `NAME=value program` or `export`: bash refuses to
    assign its read-only variables (SHELLOPTS, BASHOPTS, UID, ...), env(1) passes any name on."""
    if not env:
        return []
    words = ["env", *(assignment(name, value) for name, value in env.items())]
    if "=" in program:
        words += [word(part) for part in _EXEC_AS_GIVEN]
    return words


def comment(text: str) -> str:
    return f"# {shown(text)}"


def terminator(body: str, base: str) -> str:
    """`base`, or `base_<n>` for the first n that no line of `body` equals."""
    if not _TERMINATOR.fullmatch(base):
        raise EmitError(f"shell: {base!r} is not a here-document terminator pdserve uses")
    lines = set(body.split("\n"))
    found, n = base, 0
    while found in lines:
        n += 1
        found = f"{base}_{n}"
    return found


def heredoc(command: str, body: str, base: str) -> list[str]:
    """Lines that run `command` (shell already emitted, e.g. `cat > 'file'`) with `body` on its standard
    input, exactly: a quoted terminator that no line of `body` equals. A here-document ends with a newline:
    a body without one gets one."""
    if "\0" in body:
        raise EmitError("shell: a NUL byte cannot be carried in a here-document")
    text = body if body.endswith("\n") else body + "\n"
    end = terminator(text, base)
    return [f"{command} <<'{end}'", *text[:-1].split("\n"), end]
