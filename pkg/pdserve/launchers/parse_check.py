"""Run command lines through SGLang's and sglang-router's own argument parsers.

Runs under the SGLang Python (imports nothing from pdserve). Reads a JSON list of
{"role", "program": "server"|"router", "args": [...]} on stdin and prints one JSON list of
{"role", "status": "ok"|"error"|"unavailable", "detail"} on stdout. argparse reports errors on
stderr and exits; both are captured so the caller gets the parser's own words.
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
        from sglang_router.launch_router import parse_router_args

        router_args = parse_router_args(args)
        validate = getattr(router_args, "_validate_router_args", None)
        if validate:
            validate()


def check(item):
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            parse(item["program"], item["args"])
    except ImportError as exc:
        return {"role": item["role"], "status": "unavailable", "detail": f"{type(exc).__name__}: {exc}"}
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        return {"role": item["role"], "status": "error", "detail": lines[-1] if lines else "parser exited"}
    except Exception as exc:  # the parsers' own validation raises ValueError and friends
        return {"role": item["role"], "status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    return {"role": item["role"], "status": "ok", "detail": ""}


def main():
    items = json.load(sys.stdin)
    results = [check(item) for item in items]
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
