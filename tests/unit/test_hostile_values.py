"""Hostile values (issue 14, item 1): what systemd cannot carry exactly is refused by `pdserve check`
with field, value and fix; nothing ever becomes an extra directive; everything else is rendered so that
systemd reads it back exactly (proven against real systemd in tests/integration/systemd/test_hostile_values.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.renderable import renderable_from_data
from pdserve.render.units import render_units
from pdserve.schema.problems import ConfigError

REPRODUCER = "pdserve\nExecStartPre=+/bin/touch /x"
# Linux's MAX_ARG_STRLEN and systemd's LONG_LINE_MAX, written out so the tests do not take them from the code.
MAX_ARG_STRLEN = 131072
LONG_LINE_MAX = 1024 * 1024


def check(tmp_path, data) -> tuple[int, list[str]]:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["check", "-c", str(path), "--no-host", "--no-parsers"])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output.splitlines()


def problems(data) -> dict[str, object]:
    with pytest.raises(ConfigError) as caught:
        renderable_from_data(data, "t")
    return {p.field: p for p in caught.value.problems}


def test_the_issues_reproducer_is_refused_by_check_with_field_value_and_fix(tmp_path, reference_data):
    reference_data["systemd"]["user"] = REPRODUCER
    code, lines = check(tmp_path, reference_data)
    assert code == 1
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, lines
    line = errors[0]
    assert line.startswith('error: systemd.user = "pdserve\\nExecStartPre=+/bin/touch /x": ')
    assert "control character (U+000A" in line and "; fix: " in line
    # One problem, one line: the hostile value cannot split the report either.
    assert not any(line.startswith("ExecStartPre") for line in lines)


# Every field whose value reaches a unit file, an argv or an environment, as (section, key, wrap):
# wrap turns the hostile text into the field's shape.
FIELDS = {
    "name": (None, "name", lambda v: v),
    "model.path": ("model", "path", lambda v: f"/models/{v}"),
    "model.served_name": ("model", "served_name", lambda v: v),
    "model.chat_template": ("model", "chat_template", lambda v: v),
    "prefill.extra_args": ("prefill", "extra_args", lambda v: ["--x", v]),
    "decode.host": ("decode", "host", lambda v: f"127.0.0.1{v}"),
    "router.host": ("router", "host", lambda v: f"127.0.0.1{v}"),
    "router.prometheus_host": ("router", "prometheus_host", lambda v: f"127.0.0.1{v}"),
    "router.api_key_file": ("router", "api_key_file", lambda v: f"/etc/k{v}"),
    "router.extra_args": ("router", "extra_args", lambda v: [v]),
    "environment.UCX_TLS": ("environment", "UCX_TLS", lambda v: v),
    "fallback.env.X": ("fallback", "env", lambda v: {"X": v}),
    "transfer.ib_devices": ("transfer", "ib_devices", lambda v: [f"mlx5_0{v}"]),
    "systemd.user": ("systemd", "user", lambda v: f"pdserve{v}"),
    "systemd.group": ("systemd", "group", lambda v: f"pdserve{v}"),
    "systemd.supplementary_groups": ("systemd", "supplementary_groups", lambda v: [f"video{v}"]),
    "systemd.wanted_by": ("systemd", "wanted_by", lambda v: f"multi-user.target{v}"),
    "tools.sglang_python": ("tools", "sglang_python", lambda v: f"/opt/py{v}"),
    "tools.numactl": ("tools", "numactl", lambda v: f"/usr/bin/numactl{v}"),
    "tools.pdserve": ("tools", "pdserve", lambda v: f"/usr/bin/pdserve{v}"),
}
CONTROL = {"LF": "\nExecStartPre=+/bin/touch /x", "CR": "\rx", "NUL": "\0x", "tab": "\tx", "ESC": "\x1b[2J",
           "DEL": "\x7f", "C1 NEL": "\x85"}


@pytest.mark.parametrize("char", sorted(CONTROL))
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_control_character_in_any_field_is_refused_naming_that_field(reference_data, field, char):
    section, key, wrap = FIELDS[field]
    value = wrap(CONTROL[char])
    (reference_data if section is None else reference_data.setdefault(section, {}))[key] = value
    found = problems(reference_data)
    assert field in found, sorted(found)
    assert "control character" in found[field].message
    assert found[field].fix


def test_a_hostile_environment_key_is_reported_without_breaking_the_line(reference_data):
    reference_data["environment"]["A\nExecStartPre=/bin/x"] = "1"
    found = problems(reference_data)
    (field,) = [f for f in found if f.startswith("environment[")]
    assert "\n" not in field and "\n" not in found[field].line()


def test_a_lone_surrogate_from_json_is_refused_not_a_traceback(tmp_path, reference_data):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(reference_data).replace('"deepseek-v4-flash"', '"x\\ud800"'))
    result = CliRunner().invoke(main, ["check", "-c", str(path), "--no-host", "--no-parsers"])
    assert result.exit_code == 1 and "lone surrogate" in result.output


def test_a_value_longer_than_the_kernel_takes_is_refused(reference_data):
    reference_data["model"]["served_name"] = "x" * MAX_ARG_STRLEN
    assert "MAX_ARG_STRLEN" in problems(reference_data)["model.served_name"].message


def test_extra_args_that_would_make_a_line_over_long_line_max_are_refused(reference_data):
    reference_data["decode"]["extra_args"] = ["--x"] + ["y" * 100_000] * 11
    problem = problems(reference_data)["decode.extra_args"]
    assert "LONG_LINE_MAX" in problem.message


def test_argv_and_environment_beyond_the_exec_budget_are_refused(reference_data):
    reference_data["environment"].update({f"V{i}": "v" * 100_000 for i in range(25)})
    assert "E2BIG" in problems(reference_data)["environment"].message


@pytest.mark.parametrize(("field", "value", "words"), [
    ("systemd.user", "pd serve", "user/group name"),
    ("systemd.user", "-pdserve", "user/group name"),
    ("systemd.group", "a:b", "user/group name"),
    ("systemd.wanted_by", "multi-user.target other.target", "unit name"),
    ("systemd.wanted_by", "multi-user", "unit name"),
    ("router.host", "127.0.0.1/evil", "neither an IP address nor a host name"),
    ("router.host", "user@host", "neither an IP address nor a host name"),
    ("router.api_key_file", "/etc/pdserve/../shadow", "normalized"),
    ("router.api_key_file", "/etc/pdserve/key ", "whitespace"),
    ("tools.sglang_python", '/opt/a"b/python', "Executable name contains special characters"),
    ("tools.sglang_python", "/opt/a\\b/python", "Executable name contains special characters"),
    ("tools.sglang_python", "/opt/sglang/bin/", "directory"),
    ("transfer.ib_devices", ["mlx5_0,mlx5_1"], "RDMA device name"),
])
def test_values_systemd_parses_as_names_or_paths_must_be_valid_ones(reference_data, field, value, words):
    section, key = field.split(".")
    reference_data.setdefault(section, {})[key] = value
    found = problems(reference_data)
    assert field in found and words in found[field].message, found


# Values systemd can carry exactly: accepted, and rendered with its quoting, specifier and $ rules.
NASTY = "a  b $HOME ${HOME} $$ %n %% \"dq\" 'sq' \\ \\n ; -x @y +z !w ü€😀 \u2028"


def test_hostile_but_representable_values_are_accepted(reference_data):
    reference_data["model"]["served_name"] = NASTY
    reference_data["model"]["chat_template"] = NASTY
    reference_data["prefill"]["extra_args"] = [NASTY, ";", "", "-"]
    reference_data["environment"]["NASTY"] = NASTY
    reference_data["router"]["api_key_file"] = "/etc/pdserve/key $HOME %n ü.key"
    reference_data["tools"] = {"sglang_python": "/opt/sg $HOME %n ;@+!-/bin/python"}
    loaded = renderable_from_data(reference_data, "t")
    assert loaded.deployment.model.served_name == NASTY


def test_quoting_follows_systemds_command_line_rules():
    from pdserve.schema import systemd_syntax

    assert systemd_syntax.exec_word("plain-word_1.2/x=y,z") == "plain-word_1.2/x=y,z"
    assert systemd_syntax.exec_word("a b") == '"a b"'
    assert systemd_syntax.exec_word('q"\\') == '"q\\"\\\\"'
    assert systemd_syntax.exec_word("100%") == '"100%%"'
    assert systemd_syntax.exec_word("$HOME") == '"$$HOME"'
    assert systemd_syntax.exec_word(";") == '";"'
    assert systemd_syntax.exec_word("") == '""'
    # A $ anywhere: the whole line turns expansion off with ":" and writes $ as is, so that the
    # executable path (never expanded by systemd) and argv[0] (expanded otherwise) both stay exact.
    assert systemd_syntax.exec_line(["/opt/a$b/py", "x$y"]) == ':"/opt/a$b/py" "x$y"'
    assert systemd_syntax.exec_line(["/opt/100%/py", "x"]) == '"/opt/100%%/py" x'
    with pytest.raises(systemd_syntax.Unrepresentable):
        systemd_syntax.exec_line(['/opt/a"b/py'])


def test_the_last_gate_refuses_any_line_that_is_not_one_exact_directive():
    from pdserve.schema import systemd_syntax

    for value in ("a\nExecStartPre=/bin/x", "a\rb", "a\0b", "ends in \\", " lead", "x" * LONG_LINE_MAX):
        with pytest.raises(systemd_syntax.Unrepresentable):
            systemd_syntax.directive("Description", value)
    assert systemd_syntax.directive("Description", "fine") == "Description=fine"


def test_a_deployment_that_bypassed_loading_still_never_renders_an_extra_directive(reference, tools):
    """Defence in depth: rendering re-checks what loading refused."""
    systemd = reference.systemd.model_copy(update={"user": REPRODUCER})
    dep = reference.model_copy(update={"systemd": systemd})
    with pytest.raises(ConfigError) as caught:
        render_units(dep, tools, "/etc/pdserve/dsv4.json")
    assert "user/group name" in caught.value.problems[0].message


def test_a_hostile_config_path_flag_is_refused(reference, tools):
    with pytest.raises(ConfigError) as caught:
        render_units(reference, tools, "/etc/x\nExecStartPre=+/bin/touch /x")
    assert caught.value.problems[0].field == "--config-path"


def test_render_with_a_hostile_tool_flag_exits_1_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", "/opt/x\n/py",
                                       "--numactl", "/usr/bin/numactl", "--pdserve", "/usr/bin/pdserve"])
    assert result.exit_code == 1 and 'error: --sglang-python = "/opt/x\\n/py"' in result.output, result.output
    assert not out.exists() or list(out.iterdir()) == []


def test_check_refuses_a_hostile_tool_flag_too(tmp_path):
    result = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "--numactl", "/usr/bin/numactl\nX=1"])
    assert result.exit_code == 1 and "error: --numactl" in result.output, result.output


def test_hostile_units_pass_systemd_analyze_verify(reference_data, tmp_path):
    """systemd 252's own parser reads the hostile units without a warning (the container tier then
    runs them and records what each process received)."""
    import shutil

    from pdserve.render.toolchain import Toolchain
    from tests.conftest import require_or_skip
    from tests.unit.test_systemd_analyze import HOST_UNITS, analyze, make_root

    require_or_skip(shutil.which("systemd-analyze") is not None and HOST_UNITS.is_dir(),
                    "systemd-analyze or /usr/lib/systemd/system is missing", "PDSERVE_REQUIRE_SYSTEMD")
    reference_data["model"]["served_name"] = NASTY
    reference_data["prefill"]["extra_args"] = [NASTY, ";", "", "-"]
    reference_data["environment"]["NASTY"] = NASTY
    reference_data["router"]["api_key_file"] = "/etc/pdserve/key $HOME %n ü.key"
    dep = renderable_from_data(reference_data, "t").deployment
    tool_dir = "/opt/hostile tools $HOME %n ;x @+!-ü"
    tools = Toolchain(sglang_python=f"{tool_dir}/python $1", numactl=f"{tool_dir}/numactl %i",
                      pdserve=f"{tool_dir}/pdserve ${{X}}", keyed_launcher=f"{tool_dir}/keyed %n.py")
    units = render_units(dep, tools, "/etc/pdserve/x $HOME %n.json")
    done = analyze(make_root(tmp_path, units, tools), units)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_a_huge_value_is_shown_cut_in_its_problem_line(tmp_path, reference_data):
    reference_data["model"]["served_name"] = "\n" + "x" * 300_000
    code, lines = check(tmp_path, reference_data)
    (line,) = [line for line in lines if line.startswith("error: model.served_name")]
    assert code == 1 and len(line) < 1000 and "characters)" in line
