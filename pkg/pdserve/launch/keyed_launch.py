"""Start the router (smg) or an SGLang server with an API key read from a systemd credential.

Both programs take the key only as `--api-key KEY`, which every user can read through ps. This
script runs under the SGLang Python (it imports nothing from pdserve), reads the key from
$CREDENTIALS_DIRECTORY/<name> (systemd's LoadCredential=), parses the remaining arguments with the
program's own parser, sets the key on the parsed arguments and starts the program in-process.

usage: python keyed_launch.py {router,server} CREDENTIAL_NAME -- PROGRAM_ARGS...
"""

import os
import sys


def read_key(credential: str) -> str:
    # The one key reader outside pdserve.probes.credentials, which this Python cannot import. It reads only
    # what systemd put in $CREDENTIALS_DIRECTORY: a regular file systemd wrote itself, within its own size
    # limit, so that reader's refusals (FIFOs, oversized files) have nothing to refuse here.
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        sys.exit("keyed_launch: $CREDENTIALS_DIRECTORY is unset; pass the key with LoadCredential=")
    path = os.path.join(directory, credential)
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except OSError as exc:
        sys.exit(f"keyed_launch: cannot read the API key credential {path}: {exc.strerror}")
    if not key:
        sys.exit(f"keyed_launch: the API key credential {path} is empty; write the key into the file")
    return key


def run_router(args, key):
    from smg.launch_router import launch_router, parse_router_args

    router_args = parse_router_args(args)
    router_args.api_key = key
    launch_router(router_args)


def set_server_key(server_args, key):
    # SGLang 0.5.17's prepare_server_args returns a resolved, read-only ServerArgs: assigning a field raises
    # AttributeError, and override() is its one sanctioned mutation (found by the GPU tier, 2026-12-06: the
    # keyed single-server fallback never started). 0.5.23 has no override() and resolves later, in run_server.
    # The key is never added to the parser's argv instead: 0.5.23 keeps that argv as launch_command, which
    # /server_info returns.
    if hasattr(type(server_args), "override"):
        server_args.override("pdserve keyed_launch", api_key=key)
    else:
        server_args.api_key = key


def run_server(args, key):
    from sglang.launch_server import run_server as sglang_run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(args)
    set_server_key(server_args, key)
    try:
        sglang_run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv):
    if len(argv) < 3 or argv[0] not in {"router", "server"} or argv[2] != "--":
        sys.exit(__doc__.strip().splitlines()[-1])
    target, credential, args = argv[0], argv[1], argv[3:]
    key = read_key(credential)
    (run_router if target == "router" else run_server)(args, key)


if __name__ == "__main__":
    main(sys.argv[1:])
