"""systemd's syntax rules for the values pdserve writes into unit files. Pure: strings in, strings out.

Every value that reaches a unit file goes through one of the `*_value`/`*_line` functions here, and
`directive()` is the last gate for every line: a value that cannot be written so that systemd reads
back exactly that value raises `Unrepresentable` instead of producing a unit. The loader reports the
same conditions earlier, per field, with `text_problem()` and the name/path checks below, so a bad
deployment is refused by `pdserve check` before anything is rendered.

The rules, from systemd 252 (Debian 12) and its man pages:
- systemd.syntax: a unit file is read line by line (at most LONG_LINE_MAX bytes, or the unit does not
  load); a line ending in a backslash continues on the next one; whitespace around a value is dropped.
  So a value must not hold a line break, end in a backslash or start/end with whitespace.
- systemd.unit "Specifiers": `%x` is expanded in almost every directive; a literal `%` is `%%`.
- systemd.service "Command lines": words split on whitespace, "double quotes" group a word, C escapes
  (`\\`, `\"`) are decoded, `$NAME`/`${NAME}` are expanded at start (`$$` is a literal `$`) unless the
  line starts with `:`, which turns that expansion off for the executable and every argument alike.
  The executable must be a valid absolute path without quotes, backslashes or control characters
  ("Executable name contains special characters"), and not end in `/`.
- systemd.exec Environment=: "NAME=value" words, quotes and C escapes decoded, specifiers expanded, no
  `$` expansion.
- Linux: an argv or environment string longer than MAX_ARG_STRLEN makes execve fail with E2BIG.
"""

from __future__ import annotations

import re
import unicodedata

# systemd src/basic/fileio.h: read_line() refuses longer lines, and the unit then fails to load.
LONG_LINE_MAX = 1024 * 1024
# Linux include/uapi/linux/binfmts.h: the longest single argv or environment string, NUL included.
MAX_ARG_STRLEN = 32 * 4096
# The longest value pdserve accepts in any field: a whole argv string, NUL excluded.
MAX_VALUE_BYTES = MAX_ARG_STRLEN - 1
PATH_MAX = 4096
NAME_MAX = 255

# systemd's valid_user_group_name() without VALID_USER_RELAX: what User=/Group= accept on every distribution.
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
# systemd's unit_name_is_valid(): these characters, a known type suffix, at most 255 bytes.
UNIT_NAME = re.compile(
    r"[A-Za-z0-9:_.@-]+\.(service|socket|device|mount|automount|swap|target|path|timer|slice|scope)"
)
UNIT_NAME_MAX = 255
# The characters an unquoted ExecStart= word may hold and mean only themselves.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_DIRECTIVE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*")


class Unrepresentable(ValueError):
    """A value that systemd would not read back exactly. Rendering stops; nothing is written."""


def _control_name(char: str) -> str:
    return unicodedata.name(char, "") or {
        "\0": "NUL", "\t": "tab", "\n": "line feed", "\r": "carriage return", "\x1b": "escape", "\x7f": "delete",
    }.get(char, "control character")


def text_problem(value: str) -> str | None:
    """What stops `value` from reaching a unit file, an argv or an environment byte for byte, or None.

    NUL cannot be carried at all (C strings end there); line breaks end a directive; the other C0/C1
    control characters and DEL would only survive as escapes that some directives decode and others do
    not, and they garble journal, `systemctl cat` and `ps` output, so pdserve refuses them everywhere.
    """
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate, which cannot be written as UTF-8)"
    for char in value:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            where = value.index(char)
            return (f"contains a control character (U+{code:04X} {_control_name(char).lower()}) at offset {where}, "
                    "which systemd cannot carry exactly (a line break would even start a new directive)")
    if size > MAX_VALUE_BYTES:
        return (f"is {size} bytes long; the kernel refuses an argument or environment string over "
                f"{MAX_VALUE_BYTES} bytes (MAX_ARG_STRLEN)")
    return None


TEXT_FIX = "remove the control characters (write the value on one line, without NUL, CR, LF or tab)"


def executable_problem(path: str, *, bare_name: bool = False) -> str | None:
    """What stops systemd from executing `path` as the first word of ExecStart=, or None. systemd also
    takes a bare file name (looked up in its fixed search path): `pdserve plan` shows those for tools
    it could not find; a deployment names absolute paths."""
    problem = text_problem(path)
    if problem:
        return problem
    if not path.startswith("/") and not (bare_name and path and "/" not in path and path not in {".", ".."}):
        return "must be an absolute path"
    bad = sorted({c for c in path if c in "\"'\\"})
    if bad:
        return (f"contains {' '.join(bad)}, which systemd refuses in an executable path "
                "(\"Executable name contains special characters\") however it is quoted")
    if path.endswith("/"):
        return "ends in '/': systemd refuses a directory as the executable"
    return path_length_problem(path)


def path_length_problem(path: str) -> str | None:
    if len(path.encode("utf-8")) >= PATH_MAX:
        return f"is longer than PATH_MAX ({PATH_MAX - 1} bytes)"
    long_parts = [part for part in path.split("/") if len(part.encode("utf-8")) > NAME_MAX]
    if long_parts:
        return f"has a path component longer than NAME_MAX ({NAME_MAX} bytes)"
    return None


def normalized_path_problem(path: str) -> str | None:
    """What stops `path` from being a file path systemd takes verbatim (LoadCredential=, ...), or None."""
    problem = text_problem(path) or path_length_problem(path)
    if problem:
        return problem
    if not path.startswith("/"):
        return "must be an absolute path"
    parts = path.split("/")[1:]
    if path != "/" and (any(part in {"", ".", ".."} for part in parts)):
        return "is not a normalized path (no '//', '/./', '/../' or trailing '/'), which systemd requires here"
    if path != path.strip() or path.endswith("\\"):
        return "ends in whitespace or a backslash, which systemd drops or reads as a line continuation"
    return None


def user_name_problem(name: str) -> str | None:
    if USER_NAME.fullmatch(name):
        return None
    return ("is not a user/group name systemd accepts everywhere: a letter or '_', then letters, digits, '_' or '-', "
            "at most 31 characters")


def unit_name_problem(name: str) -> str | None:
    if UNIT_NAME.fullmatch(name) and len(name.encode()) <= UNIT_NAME_MAX:
        return None
    return ("is not a systemd unit name: letters, digits and ':_.@-', ending in a unit type such as .target, "
            f"at most {UNIT_NAME_MAX} characters")


# -- rendering -------------------------------------------------------------------------------------


def _require_text(value: str, what: str) -> None:
    problem = text_problem(value)
    if problem:
        raise Unrepresentable(f"{what} {value!r} {problem}")


def escape_specifiers(value: str) -> str:
    """systemd.unit: `%` starts a specifier; `%%` is a literal percent sign."""
    return value.replace("%", "%%")


def _quoted(value: str, *, dollar: bool) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escape_specifiers(escaped)
    if dollar:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def exec_word(arg: str, *, expand_env: bool = True) -> str:
    """One argument of an ExecStart=-style line, read back by systemd as exactly `arg`."""
    _require_text(arg, "argument")
    if _PLAIN_WORD.fullmatch(arg):
        return arg
    return _quoted(arg, dollar=expand_env)


def exec_line(argv: tuple[str, ...] | list[str]) -> str:
    """A whole ExecStart=/ExecStartPost= value for `argv`: the executable is argv[0], the process gets
    argv byte for byte.

    systemd expands `$` in the arguments but not in the path it executes: with `$$` for a `$` in the
    executable, systemd 252 looked for a file named with `$$` ("Command ... is not executable"; the
    container tier's old-main run). A line holding any `$` therefore starts with `:` (no expansion in
    any word) and writes `$` as is; lines without `$` stay free of the prefix.
    """
    if not argv:
        raise Unrepresentable("an empty command line")
    executable = argv[0]
    problem = executable_problem(executable, bare_name=True)
    if problem:
        raise Unrepresentable(f"executable {executable!r} {problem}")
    literal = any("$" in arg for arg in argv)
    words = [_quoted(executable, dollar=False) if not _PLAIN_WORD.fullmatch(executable) else executable]
    words += [exec_word(arg, expand_env=not literal) for arg in argv[1:]]
    return (":" if literal else "") + " ".join(words)


def environment_value(name: str, value: str, *, specifiers: bool = False) -> str:
    """One Environment= assignment. Deployment values are literal (`%` escaped); pdserve's own paths
    may use systemd specifiers such as %S (state directory) by passing specifiers=True."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise Unrepresentable(f"environment variable name {name!r} is not one systemd accepts")
    _require_text(value, f"environment value of {name}")
    escaped = f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"')
    if not specifiers:
        escaped = escape_specifiers(escaped)
    return f'"{escaped}"'


def text_value(value: str) -> str:
    """A free-text directive (Description=): specifiers escaped, nothing else decoded by systemd."""
    _require_text(value, "text")
    if value != value.strip() or value.endswith("\\"):
        raise Unrepresentable(f"text {value!r} starts or ends with whitespace or ends in a backslash")
    return escape_specifiers(value)


def name_value(name: str) -> str:
    """User=, Group=: one valid user or group name."""
    problem = user_name_problem(name)
    if problem:
        raise Unrepresentable(f"user/group name {name!r} {problem}")
    return name


def names_value(names: list[str] | tuple[str, ...]) -> str:
    """SupplementaryGroups=: a space-separated list of valid group names."""
    return " ".join(name_value(name) for name in names)


def unit_names_value(names: list[str] | tuple[str, ...]) -> str:
    """WantedBy=, Requires=, After=, ...: a space-separated list of unit names (specifiers escaped)."""
    for name in names:
        problem = unit_name_problem(name)
        if problem:
            raise Unrepresentable(f"unit name {name!r} {problem}")
    return " ".join(escape_specifiers(name) for name in names)


def path_value(path: str) -> str:
    """A file path systemd takes verbatim after specifier expansion (LoadCredential='s source, ...)."""
    problem = normalized_path_problem(path)
    if problem:
        raise Unrepresentable(f"path {path!r} {problem}")
    return escape_specifiers(path)


def _credential_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,255}", name) or name in {".", ".."}:
        raise Unrepresentable(f"credential name {name!r} is not one systemd accepts")
    return name


def credential_value(name: str, path: str) -> str:
    """LoadCredential=ID:PATH."""
    return f"{_credential_name(name)}:{path_value(path)}"


def set_credential_value(name: str, data: str) -> str:
    """SetCredential=ID:DATA for a short plain word (letters, digits, `-_.`: nothing systemd unescapes).
    Beside LoadCredential= of the same ID it is the stand-in systemd passes when the file cannot be loaded,
    which then does not fail the start (systemd.exec(5) of systemd 252)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,255}", data):
        raise Unrepresentable(f"credential data {data!r} is not a plain word")
    return f"{_credential_name(name)}:{data}"


def directive(key: str, value: str) -> str:
    """The last gate for every line of a unit: one `Key=value` line that systemd reads as one directive
    holding exactly `value` (whatever escaping `value` already carries)."""
    if not _DIRECTIVE_KEY.fullmatch(key):
        raise Unrepresentable(f"directive name {key!r} is not a systemd key")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise Unrepresentable(f"{key}= value {value!r} holds a control character")
    if value != value.strip():
        raise Unrepresentable(f"{key}= value {value!r} starts or ends with whitespace, which systemd drops")
    if value.endswith("\\"):
        raise Unrepresentable(f"{key}= value ends in a backslash, which systemd reads as a line continuation")
    line = f"{key}={value}"
    if len(line.encode("utf-8")) >= LONG_LINE_MAX:
        raise Unrepresentable(f"{key}= line is over {LONG_LINE_MAX} bytes (systemd's LONG_LINE_MAX): "
                              "the unit would not load")
    return line
