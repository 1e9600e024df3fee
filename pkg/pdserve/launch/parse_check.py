"""Run command lines through SGLang's and the router's (smg's) own argument parsers.

Runs under the SGLang Python (imports nothing from pdserve). Reads a JSON list of
{"role", "program": "server"|"router", "args": [...], "extra": N} on stdin (the last N args come from
the deployment's extra_args) and prints one JSON list of
{"role", "status": "ok"|"error"|"unavailable", "detail", "culprit": "rendered"|"extra"|null, "arg"} on
stdout. argparse reports errors on stderr and exits; both are captured so the caller gets the parser's
own words. On an error the culprit is found by parsing again: without the extra args (then pdserve's
own flags are at fault), and without one extra option at a time (then that option is).
"""

import contextlib
import io
import json
import sys


def parse(program, args):
    if program == "server":
        from sglang.srt.server_args import prepare_server_args

        prepare_server_args(args)
    else:
        from smg.launch_router import parse_router_args

        # smg's argparse takes the parser names (--reasoning-parser, --tool-call-parser) as choices read from
        # its Rust binary, so an unknown name is refused here as smg itself would refuse it at start.
        parse_router_args(args)._validate_router_args()


# Past this many extra options, the culprit is not searched for one by one (each try is a full parse).
MAX_TRIES = 32


def attempt(program, args):
    """(status, detail) of one parse: "ok", "error" with the parser's last words, or "unavailable"."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            parse(program, args)
    except ImportError as exc:
        return "unavailable", f"{type(exc).__name__}: {exc}"
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        return "error", lines[-1] if lines else "parser exited"
    except Exception as exc:  # noqa: BLE001 - the parsers' own validation raises ValueError and friends
        return "error", f"{type(exc).__name__}: {exc}"
    return "ok", ""


def options(extra):
    """The extra args as options: each starts at an arg beginning with '-' and takes the values after it."""
    groups: list[list[str]] = []
    for arg in extra:
        if arg.startswith("-") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def culprit(item):
    program, args, n = item["program"], item["args"], item.get("extra", 0)
    if n == 0:
        return "rendered", None
    base, extra = args[: len(args) - n], args[len(args) - n:]
    if attempt(program, base)[0] != "ok":
        return "rendered", None
    groups = options(extra)
    if len(groups) <= MAX_TRIES:
        for i, group in enumerate(groups):
            rest = [arg for j, g in enumerate(groups) if j != i for arg in g]
            if attempt(program, base + rest)[0] == "ok":
                return "extra", group[0]
    return "extra", None


def check(item):
    status, detail = attempt(item["program"], item["args"])
    result = {"role": item["role"], "status": status, "detail": detail, "culprit": None, "arg": None}
    if status == "error":
        result["culprit"], result["arg"] = culprit(item)
    return result


def main():
    items = json.load(sys.stdin)
    results = [check(item) for item in items]
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
