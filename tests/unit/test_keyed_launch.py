"""The keyed launcher sets the API key on SGLang's server arguments through each version's own way.

SGLang 0.5.17's `prepare_server_args` returns a ServerArgs that is already resolved and read-only: any public
attribute set afterwards raises AttributeError ("server_args.api_key assigned after resolution"). The GPU tier
found it on 2026-12-06: the single-server fallback of a keyed deployment never started on 0.5.17, so
`pdserve bench --compare single,pd` rolled back. 0.5.17's one sanctioned mutation is ServerArgs.override().
The fixture below mirrors that behaviour from SGLang 0.5.17's own source (sglang/srt/server_args.py:
ServerArgs.__setattr__, override and prepare_server_args), which cannot be imported here (its module imports
torchvision and CUDA-only packages); the pinned 0.5.23's real parser, which has no override() and resolves
later, is exercised by the stand-in tier (tests/integration/test_verify_standin.py), which also checks that
the key never reaches /server_info.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYED_LAUNCHER = Path(__file__).resolve().parents[2] / "pkg" / "pdserve" / "launch" / "keyed_launch.py"

SEALED_SERVER_ARGS = '''
import argparse


class ServerArgs:
    """As SGLang 0.5.17's: once resolved, a public attribute cannot be assigned."""

    def __init__(self, namespace):
        for name, value in vars(namespace).items():
            setattr(self, name, value)
        object.__setattr__(self, "_declarations_materialized", True)

    def override(self, source, **fields):
        object.__setattr__(self, "_in_override", True)
        try:
            for name, value in fields.items():
                setattr(self, name, value)
        finally:
            object.__setattr__(self, "_in_override", False)

    def __setattr__(self, name, value):
        if (not name.startswith("_") and getattr(self, "_declarations_materialized", False)
                and not getattr(self, "_in_override", False)):
            raise AttributeError(f"server_args.{name} assigned after resolution; server_args is read-only")
        object.__setattr__(self, name, value)


def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--api-key", default=None)
    return ServerArgs(parser.parse_args(argv))
'''

RECORDING_LAUNCH_SERVER = '''
import json
import os


def run_server(server_args):
    with open(os.environ["RECORD"], "w") as handle:
        json.dump({"api_key": server_args.api_key, "model_path": server_args.model_path}, handle)
'''


def sealed_sglang(root: Path) -> Path:
    """A `sglang` package with 0.5.17's read-only ServerArgs and a run_server that records what it got."""
    package = root / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "server_args.py").write_text(SEALED_SERVER_ARGS)
    (package / "srt" / "utils.py").write_text("def kill_process_tree(pid, include_parent=True):\n    pass\n")
    (package / "launch_server.py").write_text(RECORDING_LAUNCH_SERVER)
    return root


@pytest.mark.parametrize("key", ["sekrit", "-starts-with-a-dash", "has=equals"])
def test_the_server_gets_its_key_through_a_resolved_read_only_server_args(tmp_path, key):
    site = sealed_sglang(tmp_path / "site")
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "api-key").write_text(key + "\n")
    record = tmp_path / "record.json"
    done = subprocess.run(
        [sys.executable, str(KEYED_LAUNCHER), "server", "api-key", "--", "--model-path", "/models/m"],
        env={"PYTHONPATH": str(site), "CREDENTIALS_DIRECTORY": str(tmp_path / "creds"), "RECORD": str(record)},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text()) == {"api_key": key, "model_path": "/models/m"}


def test_the_fixture_refuses_what_the_old_launcher_did(tmp_path):
    """The fixture is not a pushover: assigning the key after parsing, as the launcher did before, fails."""
    site = sealed_sglang(tmp_path / "site")
    done = subprocess.run(
        [sys.executable, "-c", "from sglang.srt.server_args import prepare_server_args\n"
         "args = prepare_server_args(['--model-path', '/m'])\nargs.api_key = 'k'"],
        env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "assigned after resolution" in done.stderr
