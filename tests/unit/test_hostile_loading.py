"""Strict loading (issue 14, item 2): whole-value patterns, no type coercion, bounds where systemd or the
OS has limits, duplicate keys refused in JSON as in TOML, and hostile files answered with one line and
exit 1 through the CLI, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.schema.loading import deployment_from_data, load
from pdserve.schema.problems import ConfigError
from tests.conftest import require_or_skip


def problems(data) -> dict:
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "t")
    return {p.field: p for p in caught.value.problems}


def cli_check(path: Path):
    result = CliRunner().invoke(main, ["check", "-c", str(path), "--no-host", "--no-parsers"])
    # A traceback surfaces as an exception other than SystemExit.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def one_line_refusal(result, words: str) -> None:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert words in errors[0] and "; fix: " in errors[0], errors[0]
    assert "Traceback" not in result.output


# -- types: nothing coerced ------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key", "value"), [
    ("router", "port", True),
    ("router", "port", "30001"),
    ("router", "port", 30001.0),
    ("prefill", "port", False),
    ("systemd", "start_timeout_sec", 1800.0),
    ("systemd", "start_timeout_sec", "1800"),
    ("model", "trust_remote_code", 1),
    ("model", "trust_remote_code", "yes"),
    ("prefill", "mem_fraction_static", "0.5"),
    ("prefill", "mem_fraction_static", True),
    ("model", "served_name", 7),
    ("prefill", "gpus", [0, True]),
])
def test_no_value_is_coerced_into_another_type(reference_data, section, key, value):
    reference_data[section][key] = value
    found = problems(reference_data)
    field = f"{section}.{key}"
    assert any(f == field or f.startswith(field + ".") for f in found), sorted(found)


# -- whole-value patterns --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dsv4\n", "DSV4", "dsv4 ", "-x", "a" * 42])
def test_a_bad_deployment_name_is_refused(reference_data, name):
    reference_data["name"] = name
    assert "name" in problems(reference_data)


# -- bounds ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key"), [
    ("systemd", "start_timeout_sec"), ("systemd", "stop_timeout_sec"), ("systemd", "restart_sec"),
    ("systemd", "start_limit_interval_sec"), ("router", "request_timeout_secs"),
    ("router", "worker_startup_timeout_secs"), ("router", "health_check_timeout_secs"),
])
def test_timeouts_are_bounded_instead_of_silently_replaced_by_systemd(reference_data, section, key):
    # systemd 252 cannot hold 10^15 s (over 2^64 us): "Failed to parse TimeoutStartSec= parameter,
    # ignoring" and the default (90 s) applies; see test_systemd_ignores_a_timeout_it_cannot_hold.
    reference_data[section][key] = 10**15
    problem = problems(reference_data)[f"{section}.{key}"]
    assert "31536000" in problem.message


def test_systemd_ignores_a_timeout_it_cannot_hold(tmp_path):
    """Why the bound exists: the value would not fail the unit, it would be dropped."""
    require_or_skip(shutil.which("systemd-analyze") is not None, "systemd-analyze is missing (apt-get install systemd)",
                    "PDSERVE_REQUIRE_SYSTEMD")
    unit = tmp_path / "etc/systemd/system/t.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/bin/true\nTimeoutStartSec=1000000000000000\n")
    done = subprocess.run(["systemd-analyze", "verify", f"--root={tmp_path}", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "Failed to parse TimeoutStartSec= parameter, ignoring" in done.stderr


@pytest.mark.parametrize(("section", "key", "value"), [
    ("model", "context_length", 2**40),
    ("decode", "max_running_requests", 2**31),
    ("prefill", "numa_node", 10**6),
    ("prefill", "gpus", [10**9]),
    ("systemd", "start_limit_burst", 2**32),
    ("prefill", "extra_args", ["--x"] * 300),
    ("systemd", "supplementary_groups", ["video"] * 300),
])
def test_integers_and_lists_are_bounded(reference_data, section, key, value):
    reference_data[section][key] = value
    found = problems(reference_data)
    field = f"{section}.{key}"
    assert any(f == field or f.startswith(field + ".") for f in found), sorted(found)


def test_an_environment_with_too_many_variables_is_refused(reference_data):
    reference_data["environment"] = {f"V{i}": "1" for i in range(300)}
    assert "more than 256" in problems(reference_data)["environment"].message


# -- files -----------------------------------------------------------------------------------------

def test_duplicate_keys_in_json_are_refused_as_toml_refuses_them(tmp_path, reference_data):
    text = json.dumps(reference_data)
    path = tmp_path / "d.json"
    path.write_text(text.replace('"name": "dsv4"', '"name": "dsv4", "name": "other"', 1))
    one_line_refusal(cli_check(path), "appears twice")
    toml = tmp_path / "d.toml"
    toml.write_text('name = "dsv4"\nname = "other"\n')
    one_line_refusal(cli_check(toml), "is not valid TOML")


@pytest.mark.parametrize(("suffix", "content", "words"), [
    (".toml", b'name = "\xff\xfe"\n', "is not UTF-8 text"),
    (".json", b'{"name": "caf\xe9"}', "is not UTF-8 text"),
    (".toml", b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary file"),
    (".json", b"[" * 200_000, "nests"),
    (".toml", b"a = " + b"[" * 200_000, "nests"),
    (".json", b'{"a":' * 50 + b"1" + b"}" * 50, "nests tables/arrays more than"),
    (".json", b'{"name": ' + b"9" * 5000 + b"}", "is not valid JSON"),
    (".json", b"[1, 2]", "does not hold a table/object"),
    (".json", b"", "is not valid JSON"),
])
def test_hostile_files_get_one_line_and_exit_1(tmp_path, suffix, content, words):
    path = tmp_path / f"d{suffix}"
    path.write_bytes(content)
    one_line_refusal(cli_check(path), words)


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.json"
    with path.open("wb") as out:
        out.write(b'{"name": "')
        out.write(b"x" * (5 * 1024 * 1024))
        out.write(b'"}')
    one_line_refusal(cli_check(path), "larger than 4 MiB")


def test_a_directory_a_fifo_and_a_missing_file_are_one_line_each(tmp_path):
    directory = tmp_path / "dir.toml"
    directory.mkdir()
    with pytest.raises(ConfigError, match=r"(is not a regular file|cannot be read)"):
        load(directory)
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    # In a subprocess with a deadline: reading a FIFO nobody writes to would hang the loader.
    script = f"from pathlib import Path; from pdserve.schema.loading import load; load(Path({str(fifo)!r}))"
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("loading a FIFO hangs")
    assert "is not a regular file" in done.stderr, done.stderr
    one_line_refusal(cli_check(tmp_path / "missing.toml"), "cannot be read")


def test_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "d.toml"
    path.write_text('name = "x"\n')
    path.chmod(0)
    if os.geteuid() == 0:
        # Root reads files of any mode (and CI runs as root): refuse the open as the kernel would refuse
        # anyone else, so the loader's handling of EACCES still runs there.
        real_open = os.open

        def refusing_open(name, *args, **kwargs):
            if Path(name) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
    one_line_refusal(cli_check(path), "cannot be read: Permission denied")


# -- attribution -----------------------------------------------------------------------------------

def test_one_broken_required_field_does_not_hide_the_cross_field_rules(reference_data):
    reference_data["model"]["path"] = "./models/dsv4"          # required, and wrong
    reference_data["decode"]["gpus"] = [3, 4, 5, 6]            # shares GPU 3 with prefill
    reference_data["router"]["prometheus_port"] = reference_data["router"]["port"]
    found = problems(reference_data)
    assert {"model.path", "decode.gpus", "router.prometheus_port"} <= set(found), sorted(found)


def test_a_broken_name_hides_only_what_names_it(reference_data):
    reference_data["name"] = "Bad Name"                        # a field called `name`...
    reference_data["prefill"]["extra_args"] = ["--served-model-name", "x"]  # ...and a rule about served_model_name
    found = problems(reference_data)
    assert {"name", "prefill.extra_args"} <= set(found), sorted(found)


def test_a_missing_required_section_does_not_hide_the_cross_field_rules(reference_data):
    del reference_data["model"]
    reference_data["router"]["prometheus_port"] = reference_data["router"]["port"]
    found = problems(reference_data)
    assert {"model", "router.prometheus_port"} <= set(found), sorted(found)


def test_a_control_character_does_not_hide_the_cross_field_rules(reference_data):
    reference_data["model"]["served_name"] = "m\n"
    reference_data["decode"]["gpus"] = [3, 4, 5, 6]
    assert {"model.served_name", "decode.gpus"} <= set(problems(reference_data))


# A broken field hides only the rule problems that depend on it (issue 15): every other problem of the
# file, cross-field ones included, comes in the same report.
SAME_PORT = ("router", "prometheus_port")  # a cross-field rule problem far from every broken field


@pytest.mark.parametrize(("what", "breaks", "broken_field"), [
    ("a whole section of the wrong type", lambda d: d.__setitem__("systemd", 5), "systemd"),
    ("a section that is a list", lambda d: d.__setitem__("model", ["/m"]), "model"),
    ("a broken list item", lambda d: d["prefill"]["gpus"].__setitem__(1, "x"), "prefill.gpus.1"),
    ("a broken item of extra_args", lambda d: d["decode"].__setitem__("extra_args", ["--x", 5]), "decode.extra_args.1"),
    ("a value of the wrong type in a table", lambda d: d["environment"].__setitem__("X", 5), "environment.X"),
    ("a missing required section", lambda d: d.pop("prefill"), "prefill"),
    ("two names for the SGLang Python", lambda d: d.__setitem__("tools", {"sglang_python": "/a/python",
                                                                          "sglang_venv": "/v"}), "tools.sglang_venv"),
])
def test_a_broken_field_does_not_hide_the_rest(reference_data, what, breaks, broken_field):
    breaks(reference_data)
    reference_data[SAME_PORT[0]][SAME_PORT[1]] = reference_data["router"]["port"]
    found = problems(reference_data)
    assert {broken_field, "router.prometheus_port"} <= set(found), (what, sorted(found))


def test_a_text_problem_a_field_problem_and_a_rule_problem_come_together(reference_data):
    reference_data["model"]["served_name"] = "m\n"
    reference_data["prefill"]["port"] = 70000
    reference_data["decode"]["gpus"] = [3, 4, 5, 6]
    assert {"model.served_name", "prefill.port", "decode.gpus"} <= set(problems(reference_data))


def test_a_missing_model_does_not_hide_the_public_router_warning(reference_data):
    # The warning's message says "anyone ... can use the model": an English word, not the model section.
    del reference_data["model"]
    reference_data["router"]["host"] = "0.0.0.0"
    found = problems(reference_data)
    assert {"model", "router.api_key_file"} <= set(found), sorted(found)
    assert "without an API key" in found["router.api_key_file"].message


def test_a_broken_flag_does_not_raise_a_rule_it_would_have_silenced(reference_data):
    # allow_shared_gpus = "yes" is refused; its default (false) must not turn shared GPUs into a second error.
    reference_data["allow_shared_gpus"] = "yes"
    reference_data["decode"]["gpus"] = [0, 1, 2, 3]
    reference_data["prefill"]["mem_fraction_static"] = reference_data["decode"]["mem_fraction_static"] = 0.4
    found = problems(reference_data)
    assert set(found) == {"allow_shared_gpus"}, sorted(found)


@pytest.mark.parametrize(("section", "key"), [("router", "api_key_file"), ("tools", "sglang_venv")])
def test_a_lone_surrogate_in_a_refused_path_is_a_problem_line_not_a_crash(reference_data, tmp_path, section, key):
    # The relative-path refusal quotes the value in its fix; pydantic could not encode the surrogate (exit 3).
    reference_data.setdefault(section, {})[key] = "\ud800"
    path = tmp_path / "d.json"
    path.write_text(json.dumps(reference_data))  # json writes the surrogate as the escape \ud800
    result = cli_check(path)
    assert result.exit_code == 1, result.output
    assert f"{section}.{key}" in result.output and "\\ud800" in result.output
