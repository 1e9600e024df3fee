"""The tier's own harness can fail: each consumer refuses a broken file, each reader gives back what the
consumer parsed, and the comparisons report a difference. Without these, a consumer that silently did
nothing would pass every field."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from tests.conftest import require_or_skip
from tests.property import batches, carried
from tests.property.consumers import nft, promtool, shell, systemd
from tests.property.outputs import HostOutput
from tests.property.refusals import names_field
from tests.property.schema_fields import field_cases
from tests.property.strict_json import NotStrictJson, strict_loads

UNIT = """[Unit]
Description=probe

[Service]
Environment="A=%%n $HOME \\"q\\"" B=plain
ExecStart=:/opt/probe/bin/x "a b" "" "$X" 100%% \\\\ c
"""


def test_strict_json_refuses_what_lenient_parsers_take():
    assert strict_loads('{"a": [1, "x"]}', "t") == {"a": [1, "x"]}
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1, "a": 2}', '{"a": "\\ud800"}'):
        with pytest.raises(NotStrictJson):
            strict_loads(text, "t")


def test_a_refusal_must_name_the_mutated_field():
    case = next(c for c in field_cases() if c.id == "single:prefill.port")
    problem = {"field": "prefill.port", "message": "m", "fix": "f"}
    assert names_field(problem, case)
    assert names_field({**problem, "field": "router.port", "message": "collides with prefill.port"}, case)
    assert not names_field({**problem, "field": "decode.port"}, case)
    gpu = next(c for c in field_cases() if c.id == "single:prefill.gpus[0]")
    assert names_field({**problem, "field": "prefill.gpus.0"}, gpu)
    assert names_field({**problem, "field": "prefill.gpus"}, gpu)


def test_prometheus_targets_are_split_as_go_splits_them():
    assert carried.split_host_port("127.0.0.1:9000") == ("127.0.0.1", "9000")
    assert carried.split_host_port("[::1]:9000") == ("::1", "9000")
    for bad in ("::1:9000", "[::1]9000", "host"):
        with pytest.raises(ValueError):
            carried.split_host_port(bad)


@pytest.fixture
def systemd_here():
    why = systemd.usable()
    require_or_skip(why is None, why or "", "PDSERVE_REQUIRE_SYSTEMD")


def test_systemd_reads_back_what_it_parsed_not_the_text(systemd_here):
    parsed = systemd.read_back({"pdserve-prop-probe.service": UNIT})["pdserve-prop-probe.service"]
    assert parsed.commands["ExecStart"] == [["/opt/probe/bin/x", "a b", "", "$X", "100%", "\\", "c"]]
    assert parsed.properties["Environment"] == ['A=%n $HOME "q"', "B=plain"]
    assert systemd.seconds("1h 30min 5s") == 5405 and systemd.seconds("250ms") == 0.25


def test_systemd_analyze_verify_complains_about_a_bad_unit(systemd_here, tmp_path):
    code, lines = systemd.verify({"pdserve-prop-probe.service": UNIT.replace("[Service]\n", "[Service]\nRestartt=1\n")},
                                 ["/opt/probe/bin/x"], tmp_path)
    assert any("Restartt" in line for line in lines), (code, lines)
    code, lines = systemd.verify({"pdserve-prop-probe.service": UNIT}, [], tmp_path / "missing-executable")
    assert lines, "an ExecStart= executable missing from the root must be reported"


def test_the_plan_run_records_argv_and_reports_a_difference(tmp_path):
    why = shell.usable()
    require_or_skip(why is None, why or "", "PDSERVE_REQUIRE_CONTAINER")
    tool = "/opt/pdserve-prop probe/bin/x"
    argv = [tool, "a b", "$(touch injected)", "'"]
    text = (f"env V='1 2' {shlex.join(argv)}\ncat > u.service <<'PDSERVE_UNIT_END'\nx\nPDSERVE_UNIT_END\n"
            f"{shlex.quote(tool)} two words $(touch injected)\n")
    run = shell.run_plans({"k": text}, {tool}, tmp_path / "batch")["k"]
    assert run.calls[0].argv == argv and run.calls[0].env["V"] == "1 2"
    assert run.calls[1].argv == [tool, "two", "words"]
    assert run.files == {"u.service": "x\n", "injected": ""}, run.files
    plan = {"deployment": "p", "roles": {"r": {"unit": "u", "argv": argv, "env": {"V": "1 2"}}},
            "units": {"u.service": "x\n"}}
    found = batches._compare_run(HostOutput(None, tmp_path, {}, plan, text), run)
    assert any("the plan ran" in f for f in found) and any("other files" in f for f in found), found
    assert "bash" in run.syntax and not run.syntax["bash"]
    assert shell.syntax("echo 'unterminated\n", "bash")


def test_nft_refuses_a_broken_ruleset_among_good_ones(tmp_path):
    why = nft.usable()
    require_or_skip(why is None, why or "", "PDSERVE_REQUIRE_NFT")
    good = [tmp_path / f"good{i}.nft" for i in range(3)]
    for i, path in enumerate(good):
        path.write_text(f"table inet pdserve_prop_{i} {{\n\tchain input {{\n"
                        f"\t\tip saddr {{ 10.0.0.{i + 1} }} accept\n\t}}\n}}\n")
    bad = tmp_path / "bad.nft"
    bad.write_text("table inet pdserve_prop_bad {\n\tchain input {\n\t\tip6 saddr { fe80::1%eth0 } accept\n\t}\n}\n")
    refused = nft.check_all([*good, bad], tmp_path / "work")
    assert list(refused) == [bad] and "junk" in refused[bad], refused


def test_promtool_refuses_a_broken_rule_file_among_good_ones(tmp_path):
    why = promtool.usable()
    require_or_skip(why is None, why or "", "PDSERVE_REQUIRE_PROMETHEUS")
    good = tmp_path / "good.yml"
    good.write_text(json.dumps({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]}))
    bad = tmp_path / "bad.yml"
    bad.write_text(json.dumps({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == == 0"}]}]}))
    refused = promtool.check("rules", [good, bad])
    assert list(refused) == [bad], refused


def test_the_plain_plan_reader_finds_commands_environment_and_here_documents():
    result = CliRunner().invoke(main, ["plan", "--sglang-python", "/opt/p/python", "--numactl", "/opt/p/numactl",
                                       "--pdserve", "/opt/p/pdserve"])
    found = shell.blocks(result.stdout)
    assert len(found.commands) == 4 and len(found.heredocs) == 4, result.output
    env, argv = shell.split_environment(shell.shlex_words(found.commands[0]))
    assert argv[:2] == ["/opt/p/numactl", "--cpunodebind=0"] and env["UCX_TLS"] == "cuda_copy,cuda_ipc,tcp"
    assert shell.split_environment(["env", "A=1", *shell.EXEC_AS_GIVEN, "/a=b/x", "y"]) == ({"A": "1"}, ["/a=b/x", "y"])
