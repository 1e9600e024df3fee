"""`pdserve plan`: plain, copyable shell when piped (the shell gives back the exact argv), the rich view
on a terminal, and `--json` with the same content for machines."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from rich.console import Console

from pdserve.cli.main import main
from pdserve.render.argv import launches
from pdserve.render.plan import HEREDOC_END, plain_text, plan_data, print_rich, shell_command
from pdserve.render.renderable import renderable_from_data
from pdserve.render.units import render_units
from tests.property.consumers.shell import split_environment

TOOLS = ["--sglang-python", "/opt/sg env/bin/python", "--numactl", "/usr/bin/numactl",
         "--pdserve", "/opt/pd/bin/pdserve"]
# Spaces, both quotes, $, a backslash, a glob, a semicolon and a non-ASCII letter: all must come back exactly.
NASTY = "a  b $HOME ${X} \"dq\" 'sq' \\ *.py ; ü"


def plan(tmp_path, data=None, *extra):
    args = ["plan", *TOOLS, *extra]
    if data is not None:
        path = tmp_path / "d.json"
        path.write_text(json.dumps(data))
        args += ["-c", str(path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def nasty_data(reference_data):
    reference_data["model"]["served_name"] = NASTY
    reference_data["prefill"]["extra_args"] = ["--x", NASTY, "", "--"]
    reference_data["environment"]["NASTY"] = NASTY
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router key"
    return reference_data


def command_blocks(text: str) -> list[str]:
    """The command under each `# command...` comment, continuation lines included."""
    lines, blocks = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("# command"):
            block = [lines[i + 1]]
            while block[-1].endswith(" \\"):
                block.append(lines[i + 1 + len(block)])
            blocks.append("\n".join(block))
    return blocks


def test_piped_plan_is_plain_text_without_boxes_or_folding(tmp_path, reference_data):
    text = plan(tmp_path, reference_data).output
    assert not set(text) & set("┏┃━│┌─╭╰└┘┡╇┩")
    # Every line is a comment, part of a command, or a unit here-document.
    assert "sglang-dsv4-prefill  yes" in text and "http://127.0.0.1:30000" in text
    assert "cat > sglang-dsv4-prefill.service <<'PDSERVE_UNIT_END'" in text


def test_plain_commands_parse_back_to_the_exact_argv(tmp_path, nasty_data):
    text = plan(tmp_path, nasty_data).output
    dep = renderable_from_data(nasty_data, "t").deployment
    argvs = [list(run.argv) for run in launches(dep, _tools()).values()]
    # The shell removes backslash-newline before splitting words; shlex then splits as sh does.
    assert [split_environment(shlex.split(block.replace("\\\n", "")))[1] for block in command_blocks(text)] == argvs


def test_plain_commands_run_in_a_real_shell_give_the_exact_argv_and_environment(tmp_path, nasty_data):
    """Each command run by bash, with printf's place taken by a recorder: env(1) prints the environment and
    then the argv it was given, NUL-separated (tests/unit/test_plan_runs_as_shown.py runs the real blocks)."""
    if shutil.which("bash") is None:
        pytest.skip("bash is missing")
    text = plan(tmp_path, nasty_data).output
    dep = renderable_from_data(nasty_data, "t").deployment
    for block, run in zip(command_blocks(text), launches(dep, _tools()).values(), strict=True):
        words = subprocess.run(["bash", "-c", f"printf '%s\\0' {block}"], capture_output=True, timeout=30,
                               check=True).stdout.decode().split("\0")[:-1]
        env, argv = split_environment(words)
        assert argv == list(run.argv) and env == run.env


def test_plain_unit_here_documents_write_the_exact_unit_files(tmp_path, nasty_data):
    if shutil.which("bash") is None:
        pytest.skip("bash is missing")
    text = plan(tmp_path, nasty_data).output
    docs = text.split("\n# --- unit file ")[1:]
    out = tmp_path / "out"
    out.mkdir()
    script = "\n".join(doc.split("\n", 1)[1].rsplit(HEREDOC_END, 1)[0] + HEREDOC_END for doc in docs)
    subprocess.run(["bash", "-c", script], cwd=out, timeout=30, check=True)
    data = json.loads(plan(tmp_path, nasty_data, "--json").output)
    assert {p.name: p.read_text() for p in out.iterdir()} == data["units"]


def test_plan_json_has_the_plain_views_content_and_round_trips_values(tmp_path, nasty_data):
    data = json.loads(plan(tmp_path, nasty_data, "--json").output)
    assert data["schema_version"] == 1 and data["deployment"] == "dsv4" and data["model"] == NASTY
    assert list(data["roles"]) == ["prefill", "decode", "router", "fallback"]
    prefill = data["roles"]["prefill"]
    assert prefill["unit"] == "sglang-dsv4-prefill" and prefill["url"] == "http://127.0.0.1:30000"
    assert prefill["wanted_at_boot"] is True and data["roles"]["fallback"]["wanted_at_boot"] is False
    assert prefill["numa"] == {"cpu_node": 0, "memory_node": 0} and prefill["gpus"] == [0, 1, 2, 3]
    assert prefill["argv"][:4] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--"]
    assert prefill["argv"][-4:] == ["--x", NASTY, "", "--"] and NASTY in prefill["argv"]
    assert prefill["env"]["NASTY"] == NASTY
    assert data["roles"]["router"]["credentials"] == {"api-key": "/etc/pdserve/router key"}
    assert data["roles"]["prefill"]["credentials"] == {}
    assert sorted(data["units"]) == ["sglang-dsv4-decode.service", "sglang-dsv4-prefill.service",
                                     "sglang-dsv4-router.service", "sglang-dsv4.service"]
    # The plain view shows the same commands.
    plain = plan(tmp_path, nasty_data).output
    assert [split_environment(shlex.split(b.replace("\\\n", ""))) for b in command_blocks(plain)] == \
        [(role["env"], role["argv"]) for role in data["roles"].values()]


def test_plan_without_an_sglang_python_still_shows_the_plan_with_a_note(tmp_path, reference_data):
    result = CliRunner().invoke(main, ["plan", "--json", "--numactl", "/usr/bin/numactl", "--pdserve", "/x/pdserve"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "sglang-python" in data["roles"]["prefill"]["argv"]
    (note,) = [n for n in data["notes"] if n.startswith("tools.sglang_python")]
    assert "does not guess it from PATH" in note and "tools.sglang_venv" in note and "--sglang-python" in note


def test_plan_follows_boot_layout(reference, tools):
    units = render_units(reference, tools, "/etc/x.json")
    pd = plan_data(reference, tools, units, [], "t")
    assert [r for r, item in pd["roles"].items() if not item["wanted_at_boot"]] == ["fallback"]
    single_dep = reference.model_copy(update={"boot_layout": "single"})
    single = plan_data(single_dep, tools, render_units(single_dep, tools, "/etc/x.json"), [], "t")
    assert [r for r, item in single["roles"].items() if item["wanted_at_boot"]] == ["fallback"]
    # Both views say it: the plain topology's "at boot" column, the terminal's table.
    assert "# fallback  sglang-dsv4          yes" in plain_text(single)
    console = Console(width=300, record=True)
    print_rich(console, single)
    assert [line.split("│")[3].strip() for line in console.export_text().splitlines()
            if "│ router" in line or "│ fallback" in line][:2] == ["no", "yes"]


def test_shell_command_puts_one_flag_per_line():
    text = shell_command(("/usr/bin/numactl", "--cpunodebind=0", "--", "/py", "-m", "sglang.launch_server",
                          "--port", "1", "--x", "a b"))
    assert text == "/usr/bin/numactl --cpunodebind=0 -- /py -m sglang.launch_server \\\n    --port 1 \\\n    --x 'a b'"


def test_shell_command_puts_the_environment_first_through_env():
    text = shell_command(("/opt/a=b/numactl", "--", "/py", "-m", "m", "--port", "1"), {"A": "x y", "B": ""})
    assert text == ("env \\\n    A='x y' \\\n    B='' \\\n    /bin/sh \\\n    -c \\\n    'exec \"$0\" \"$@\"' \\\n"
                    "    /opt/a=b/numactl -- /py -m m \\\n    --port 1")


def _tools():
    from pdserve.render.toolchain import Toolchain, default_keyed_launcher

    return Toolchain(sglang_python=TOOLS[1], numactl=TOOLS[3], pdserve=TOOLS[5],
                     keyed_launcher=default_keyed_launcher())
