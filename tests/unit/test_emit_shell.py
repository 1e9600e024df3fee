"""The shell emitter (pdserve.render.emit.shell) and `pdserve plan`'s plain text through it, run by the real
bash: words and assignments read back exactly, comments run nothing, and a here-document writes its body
exactly, whatever lines the body holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pdserve.render.emit import EmitError, shell
from pdserve.render.plan import HEREDOC_END, plain_text

BASH_TIMEOUT = 30
HOSTILE = ["plain", "it's", 'a "b" c', "$(touch MARK)", "`touch MARK`", "x; touch MARK", "a\nb", "\\", "*",
           "~root", "-n", "", " lead", "tab\t", "\u2028 and \x85", "emoji \U0001f600", "!!", "${HOME}"]


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=BASH_TIMEOUT,
                          check=False)


@pytest.fixture(autouse=True)
def _bash():
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")


@pytest.mark.parametrize("value", HOSTILE)
def test_a_word_and_an_assignment_read_back_exactly(value, tmp_path):
    done = bash(f"printf '%s' {shell.word(value)}", tmp_path)
    assert done.stdout == value and not (tmp_path / "MARK").exists()
    done = bash(f"{shell.assignment('V', value)}\nprintf '%s' \"$V\"", tmp_path)
    assert done.stdout == value and not (tmp_path / "MARK").exists()


@pytest.mark.parametrize("where", ["/usr/bin", "a=b"])
def test_an_environment_prefix_passes_every_value_to_the_program(where, tmp_path):
    """env(1) passes each value exactly, bash's read-only names too, and runs the program given, also one
    whose path holds `=` (which env would take for one more assignment)."""
    program = Path(where) / "env"
    if not program.is_absolute():
        (tmp_path / where).mkdir()
        program = tmp_path / program
        program.symlink_to("/usr/bin/env")
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)} | {"SHELLOPTS": "xtrace", "BASHOPTS": "x"}
    words = [*shell.environment_prefix(env, str(program)), shell.word(str(program)), "-0"]
    done = bash(" ".join(words), tmp_path)
    assert done.returncode == 0, done.stderr
    received = dict(item.split("=", 1) for item in done.stdout.split("\0")[:-1])
    assert {name: received.get(name) for name in env} == env and not (tmp_path / "MARK").exists()
    assert shell.environment_prefix({}, str(program)) == []


def test_an_assignment_needs_a_variable_name_and_nothing_carries_nul():
    for bad in ("A B", "1A", "A;B", ""):
        with pytest.raises(EmitError):
            shell.assignment(bad, "x")
    with pytest.raises(EmitError):
        shell.word("a\0b")


@pytest.mark.parametrize("value", ["x\ntouch MARK", "x\r\ntouch MARK", "x\x0btouch MARK", "x\u2028touch MARK"])
def test_a_comment_runs_nothing(value, tmp_path):
    line = shell.comment(value)
    assert "\n" not in line
    done = bash(f"{line}\necho after", tmp_path)
    assert done.stdout == "after\n" and not (tmp_path / "MARK").exists()


@pytest.mark.parametrize("body", [
    "plain\n",
    f"{HEREDOC_END}\n$(touch MARK)\n",
    f"a\n{HEREDOC_END}\n{HEREDOC_END}_1\n`touch MARK`\n${{HOME}}\n",
    "no newline at the end",
    "\n\n",
])
def test_a_heredoc_writes_its_body_exactly(body, tmp_path):
    lines = shell.heredoc(f"cat > {shell.word('out file')}", body, HEREDOC_END)
    done = bash("\n".join(lines) + "\n", tmp_path)
    assert done.returncode == 0, done.stderr
    expected = body if body.endswith("\n") else body + "\n"
    assert (tmp_path / "out file").read_text() == expected and not (tmp_path / "MARK").exists()


def test_plan_text_carries_hostile_units_firewall_and_source(tmp_path):
    """plain_text as bash runs it: every file written exactly, every comment inert (no commands here: the
    roles are empty, so running the whole text only writes the files)."""
    unit = f"[Unit]\nDescription=x\n{HEREDOC_END}\ntouch MARK\n"
    firewall = f"# rules\n{HEREDOC_END}\n$(touch MARK)\n"
    data = {"deployment": "dsv4", "model": "m\ntouch MARK", "source": "/etc/x\ntouch MARK\n.toml", "roles": {},
            "units": {"a b.service": unit}, "notes": ["note\ntouch MARK"], "firewall": firewall}
    text = plain_text(data)
    assert bash(f"bash -n <<'EOF_CHECK'\n{text}EOF_CHECK\n", tmp_path).returncode == 0
    done = bash(text, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a b.service").read_text() == unit
    assert (tmp_path / "pdserve-dsv4-firewall.nft").read_text() == firewall
    assert not (tmp_path / "MARK").exists()
