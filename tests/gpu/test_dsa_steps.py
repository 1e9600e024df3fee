"""The decode-step measurement of the DSA GPU tier (tests/gpu/dsa/steps.py, issue 38 item 5) and the side-by-side
start it shares with compare.py, on the CPU: the arithmetic (alternation, medians and ranges, paired ratios, the
profile's kernel shares on a trace in the torch profiler's chrome format), the deeper tiny models' configs, the
server commands through the real SGLang parser, and both drivers end to end on two CPU stand-ins of launch_server
(tests/gpu/dsa/standin_server.py, which mirrors the ready line, the "Memory pool end" line, /generate streaming
and /start_profile by stage from SGLang 0.5.17's source; it says nothing about SGLang's numbers)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.fixtures.ports import free_ports
from tests.gpu.dsa import server, steps
from tests.gpu.dsa.tiny_dsa_model import BASE_CONFIG as DSA_BASE
from tests.gpu.dsa.tiny_dsa_model import checkpoint_spec as dsa_spec
from tests.gpu.dsa.tiny_dsa_model import dsa_config
from tests.gpu.dsa.tiny_v4_model import BASE_CONFIG as V4_BASE
from tests.gpu.dsa.tiny_v4_model import checkpoint_spec as v4_spec
from tests.gpu.dsa.tiny_v4_model import deeper, v4_config

ROOT = Path(__file__).resolve().parents[2]

# --- arithmetic ----------------------------------------------------------------------------------------


def test_points_parse_and_refuse():
    assert steps.points("1:32768, 8:16384") == [(1, 32768), (8, 16384)]
    for bad in ("8", "0:4096", "4:-1", "a:b", "4:4096,"):
        with pytest.raises(argparse.ArgumentTypeError, match="B:C pair"):
            steps.points(bad)


def test_rounds_alternate_which_server_goes_first():
    assert steps.round_orders(4) == [("sglang", "pdserve"), ("pdserve", "sglang"), ("sglang", "pdserve"),
                                     ("pdserve", "sglang")]


def test_graphs_are_captured_for_the_measured_batches_only():
    assert steps.graph_batches([(8, 32768), (1, 32768), (8, 4096)]) == (1, 8)


def _row(r, kernels, ms):
    return {"round": r, "kernels": kernels, "ms_per_step": ms}


def test_point_summary_medians_ranges_and_paired_ratios():
    rows = [_row(0, "sglang", 10.0), _row(0, "pdserve", 9.0), _row(1, "pdserve", 9.5), _row(1, "sglang", 10.5),
            _row(2, "sglang", 11.0), _row(2, "pdserve", 8.0)]
    s = steps.summarize_point(rows)
    assert s["sglang"] == {"n": 3, "median": 10.5, "min": 10.0, "max": 11.0}
    assert s["pdserve"] == {"n": 3, "median": 9.0, "min": 8.0, "max": 9.5}
    assert s["ratio_of_medians"] == pytest.approx(9.0 / 10.5)
    assert s["paired_ratios"] == pytest.approx([0.9, 9.5 / 10.5, 8.0 / 11.0])
    # A round that failed on one server leaves no pair, and a server with no round is an error.
    partial = steps.summarize_point([*rows[:5], {"round": 2, "kernels": "pdserve", "error": "no window"}])
    assert len(partial["paired_ratios"]) == 2 and partial["pdserve"]["n"] == 2
    assert "error" in steps.summarize_point([_row(0, "sglang", 1.0)])


def _trace(kernels_per_step: list[tuple[str, float]], steps_: int, graphs: bool = True) -> dict:
    events = []
    for s in range(steps_):
        if graphs:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": s, "dur": 3})
        events += [{"ph": "X", "cat": "kernel", "name": n, "ts": s, "dur": us} for n, us in kernels_per_step]
    events.append({"ph": "i", "cat": "kernel", "name": "sparse_mla_instant", "ts": 0})  # not a complete event
    events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 0, "dur": 1000.0})  # not a kernel
    return {"traceEvents": events}


def test_profile_summary_groups_the_replaced_kernels_per_step():
    # Names as the first GPU run's profiles have them (results/2026-12-06-h200x1/v4-steps), shortened.
    sglang_step = [("void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<>", 30.0),
                   ("void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512>", 5.0),
                   ("smxx::decode::get_mla_metadata_kernel(GetDecodeSchedMetaParams)", 3.0),
                   ("void deep_gemm::sm90_fp8_paged_mqa_logits<1u, 64u>", 10.0),
                   ("(anonymous namespace)::smxx_paged_mqa_logits_metadata(MetadataParam)", 1.0),
                   ("void (anonymous namespace)::topk_main_kernel<true, 2>(TopKLaunchParams)", 5.0),
                   ("void (anonymous namespace)::fused_k_norm_rope_flashmla<__nv_bfloat16, 512l>", 4.0),
                   ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", 100.0), ("fused_moe_kernel", 42.0)]
    s = steps.profile_summary(_trace(sglang_step, 10), steps_asked=32)
    assert s["steps"] == s["graph_launches"] == 10  # counted from the trace, not the steps asked for
    assert s["kernel_us_per_step"] == pytest.approx(200.0)
    assert s["group_us_per_step"] == pytest.approx({"mla": 38.0, "indexer": 11.0, "topk": 5.0})
    assert s["attention_us_per_step"] == pytest.approx(54.0)  # the norm + RoPE kernel is not attention
    assert s["attention_share_of_kernel_time"] == pytest.approx(0.27)
    assert [k["name"][:6] for k in s["all"][:2]] == ["nvjet_", "fused_"] and len(s["all"]) == len(sglang_step)
    assert [k["group"] for k in s["all"] if "rope" in k["name"]] == [None]
    pdserve_step = [("sparse_mla_v4_h64_t64", 20.0), ("sparse_mla_combine_b8", 2.0), ("dsa_indexer_topk_fused", 12.0),
                    ("nvjet_tst_128x64", 100.0)]
    eager = steps.profile_summary(_trace(pdserve_step, 4, graphs=False), steps_asked=4)
    assert eager["graph_launches"] == 0 and eager["steps"] == 4
    assert eager["group_us_per_step"] == pytest.approx({"mla": 22.0, "indexer": 12.0, "topk": 0.0})
    assert steps.profile_summary({"traceEvents": []}, steps_asked=0)["attention_share_of_kernel_time"] is None


def test_the_plugin_on_server_must_run_every_op_its_status_gave_pdserve():
    from tests.gpu.dsa import compare

    # The first GPU run's plugin-on server: status both ops on pdserve, but only the sparse MLA decode ran (the
    # indexer hook missed its kernel table: fixed since).
    log = (ROOT / "tests/gpu/dsa/results/2026-12-06-h200x1/v4-steps/server-steps-pdserve.log").read_text()
    problems = steps.plugin_problems(compare.plugin_report(log.splitlines()))
    assert problems == ["indexer_topk: the status gave it to pdserve, but pdserve's kernel never ran"]
    both = {"status": [{"kernels": {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}}],
            "ran": [{"op": "indexer_topk"}, {"op": "sparse_mla_decode"}], "fallback": []}
    assert steps.plugin_problems(both) == []
    assert steps.plugin_problems({**both, "fallback": [{"op": "indexer_topk", "reason": "x"}]}) == [
        "fallback: {'op': 'indexer_topk', 'reason': 'x'}"]
    assert steps.plugin_problems({"status": [], "ran": [], "fallback": []}) == [
        "the plugin-on server logged no plugin status line"]


def test_failed_rounds_and_a_plugin_off_server_on_pdserve_are_problems():
    rounds = [{"round": 0, "kernels": "sglang", "ms_per_step": 2.4}, {"round": 0, "kernels": "pdserve",
                                                                       "ms_per_step": 2.5},
              {"round": 1, "kernels": "pdserve", "error": "every stream needs at least two chunks"},
              {"round": 1, "kernels": "sglang", "ms_per_step": 2.4}]
    point = {"batch": 8, "context": 16384, "rounds": rounds, "summary": steps.summarize_point(rounds)}
    assert "error" not in point["summary"]  # the medians stand on the rounds left ...
    assert steps.point_problems([point]) == [  # ... and the run says so
        "B=8 C=16384: 1 of 4 rounds failed (first: round 1 pdserve: every stream needs at least two chunks)"]
    assert steps.point_problems([{**point, "rounds": rounds[:2]}]) == []
    assert steps.point_problems([{"batch": 1, "context": 16384}]) == ["B=1 C=16384: not measured"]
    from tests.gpu.dsa import verdict

    on = {"status": [{"kernels": {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}}], "ran": [],
          "fallback": []}
    assert verdict.plugin_failures("sglang", on)  # what main() adds for the plugin-off server


def test_the_table_states_medians_ranges_ratios_and_shares():
    record = {"points": [{"batch": 8, "context": 32768,
                          "summary": steps.summarize_point([_row(0, "sglang", 10.0), _row(0, "pdserve", 9.0)]),
                          "profile": {"sglang": {"attention_us_per_step": 2500.0,
                                                 "attention_share_of_kernel_time": 0.25},
                                      "pdserve": {"error": "no decode trace"}}},
                         {"batch": 1, "context": 4096, "summary": {"error": "a server has no measured round"}}]}
    text = steps.table(record)
    assert "| 8 | 32768 | 10.000 (10.000-10.000) | 9.000 (9.000-9.000) | 0.900 (0.900) | 2500 us (25%) / no decode" \
        in text
    assert "| 1 | 4096 | a server has no measured round |" in text


def test_driver_refuses_what_it_cannot_measure(tmp_path, capsys):
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    for extra, message in ((["--rounds", "0"], "--rounds"), (["--new-tokens", "4"], "--new-tokens"),
                           (["--profile-steps", "128"], "--profile-steps"),
                           (["--points", "1:65500"], "exceeds --context-length")):
        with pytest.raises(SystemExit):
            steps.parse_args(base + extra)
        assert message in capsys.readouterr().err


# --- the deeper models -----------------------------------------------------------------------------------


def test_deeper_v4_repeats_the_base_layer_kinds():
    config = v4_config(300, 1, 2, **deeper(16))
    assert config["num_hidden_layers"] == 16
    assert config["compress_ratios"] == [0, 4, 128, 4] * 4
    names = {s.name for s in v4_spec(config)}
    assert "model.layers.15.self_attn.compressor.wkv.weight" in names  # layer 15 is C4: a compressor and an indexer
    assert "model.layers.15.self_attn.indexer.wq_b.weight" in names
    assert "model.layers.12.self_attn.compressor.wkv.weight" not in names  # window-only
    assert deeper(4)["compress_ratios"] == V4_BASE["compress_ratios"]


def test_deeper_dsa_keeps_every_layer_dense():
    config = dsa_config(300, 1, 2, layers=16)
    assert (config["num_hidden_layers"], config["first_k_dense_replace"]) == (16, 16)
    assert sum(s.name.endswith("mlp.down_proj.weight") for s in dsa_spec(config)) == 16
    assert dsa_config(300, 1, 2)["num_hidden_layers"] == DSA_BASE["num_hidden_layers"] == 2


def test_steps_server_commands_through_the_real_sglang_parser(tmp_path):
    require_or_skip(importlib.util.find_spec("sglang") is not None, "sglang is not installed",
                    "PDSERVE_REQUIRE_PARSERS")
    from sglang.srt import server_args as sglang_args
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 300}))
    for arch in ("v4", "dsa"):
        args = steps.parse_args(["--arch", arch, "--model", str(tmp_path), "--out", str(tmp_path)])
        pair = steps.make_pair(args)
        for srv in pair.values():
            assert "--disable-radix-cache" not in srv.argv  # repeated prompts hit the prefix cache
            parser = argparse.ArgumentParser()
            sglang_args.ServerArgs.add_cli_args(parser)
            parsed = parser.parse_args(srv.argv[3:])
            assert parsed.context_length == 65536 and parsed.disable_radix_cache is False
            assert parsed.chunked_prefill_size == 16384
            assert parsed.cuda_graph_bs_decode == [1, 8]
        assert pair["sglang"].port != pair["pdserve"].port
        assert (pair["sglang"].env["PDSERVE_DSA_KERNELS"], pair["pdserve"].env["PDSERVE_DSA_KERNELS"]) == \
            ("sglang", "pdserve")


# --- end to end on two stand-ins ------------------------------------------------------------------------------


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(v4_config(300, 1, 2, **deeper(8))))
    return model


def _env(tmp_path: Path, **extra) -> dict[str, str]:
    from tests.gpu.dsa.standin_server import launch_env

    return {**launch_env(tmp_path), **extra}


def test_side_by_side_starts_the_second_once_the_first_has_its_pool(tmp_path, monkeypatch):
    from tests.gpu.dsa.standin_server import launch_env

    for key, value in {**launch_env(tmp_path), "STANDIN_POOL_AFTER_S": "1.5", "STANDIN_READY_AFTER_S": "1"}.items():
        monkeypatch.setenv(key, value)
    model = _model(tmp_path)
    ports = free_ports(2)
    pair = [server.make_server(model, port, kernels, tmp_path / f"{kernels}.log", arch="v4")
            for port, kernels in zip(ports, ("sglang", "pdserve"), strict=True)]
    try:
        ready = server.start_side_by_side(pair, timeout=60)
        assert pair[1].started - pair[0].started >= 1.5  # not before the first's "Memory pool end"
        assert all(r >= 2.5 for r in ready)
        assert server.POOL_LINE in pair[0].log_text()
    finally:
        for srv in pair:
            srv.stop()


def test_side_by_side_stops_at_a_server_that_dies_and_names_it(tmp_path, monkeypatch):
    from tests.gpu.dsa.standin_server import launch_env

    for key, value in launch_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    model = _model(tmp_path)
    (port,) = free_ports(1)
    dead = server.Server(argv=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"], env={},
                         log=tmp_path / "dead.log", port=port)
    second = server.make_server(model, port, "pdserve", tmp_path / "second.log", arch="v4")
    with pytest.raises(server.ServerFailed, match="exited with 3 before it was done allocating its KV pool"):
        server.start_side_by_side([dead, second], timeout=30)
    assert second.proc is None  # never started


def test_steps_driver_end_to_end_on_two_standins(tmp_path):
    out = tmp_path / "out"
    ports = free_ports(2)
    argv = [sys.executable, str(steps.__file__), "--arch", "v4", "--model", str(_model(tmp_path)), "--out", str(out),
            "--port", str(ports[0]), "--second-port", str(ports[1]), "--points", "1:3000,4:3000", "--rounds", "2",
            "--new-tokens", "40", "--profile-steps", "16", "--profile-dir", str(tmp_path / "profile"),
            "--ready-timeout", "60", "--request-timeout", "60"]
    done = subprocess.run(argv, env=_env(tmp_path, STANDIN_POOL_AFTER_S="0.5"), capture_output=True, text=True,
                          timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0 and done.stdout.rstrip().endswith("DONE")
    record = json.loads((out / "steps.json").read_text())
    assert record["arch"] == "v4" and record["model_config"]["num_hidden_layers"] == 8
    assert set(record["ready_after_s"]) == {"sglang", "pdserve"}
    for point in record["points"]:
        order = [(r["round"], r["kernels"]) for r in point["rounds"]]
        assert order == [(0, "sglang"), (0, "pdserve"), (1, "pdserve"), (1, "sglang")]
        assert all(r["ms_per_step"] > 0 for r in point["rounds"])
        assert set(point["warmup"]) == {"sglang", "pdserve"}
        s = point["summary"]
        assert s["sglang"]["n"] == s["pdserve"]["n"] == 2 and len(s["paired_ratios"]) == 2
        # The stand-in's traces: 4 layers of a 20 us attention kernel beside a 60 us GEMM per step.
        for kernels, name in (("sglang", "flash_fwd_splitkv_mla_kernel"), ("pdserve", "sparse_mla_decode_v4")):
            prof = point["profile"][kernels]
            assert prof["steps"] == 16 and prof["attention_us_per_step"] == pytest.approx(80.0)
            assert prof["attention_share_of_kernel_time"] == pytest.approx(0.25)
            assert [k["group"] for k in prof["all"] if name in k["name"]] == ["mla"]
    assert not (out / "profile").exists() and not list((tmp_path / "profile").iterdir())  # traces read and removed
    assert "| 1 | 3000 |" in done.stdout and "| 4 | 3000 |" in done.stdout
    argv_off = record["argv"]["sglang"]
    assert "--disable-radix-cache" not in argv_off and argv_off[argv_off.index("--context-length") + 1] == "65536"


def test_compare_side_by_side_end_to_end_on_two_standins(tmp_path):
    from tests.gpu.dsa import compare

    model = _model(tmp_path)
    (model / "config.json").write_text(json.dumps(v4_config(300, 1, 2)))
    out = tmp_path / "out"
    ports = free_ports(2)
    argv = [sys.executable, str(compare.__file__), "--arch", "v4", "--model", str(model), "--out", str(out),
            "--port", str(ports[0]), "--second-port", str(ports[1]), "--ready-timeout", "60", "--request-timeout",
            "30", "--prompt-lens", "2100,2201", "--max-new-tokens", "6", "--kernels", "both", "--side-by-side"]
    done = subprocess.run(argv, env=_env(tmp_path, STANDIN_POOL_AFTER_S="0.5"), capture_output=True, text=True,
                          timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0 and done.stdout.rstrip().endswith("PASS")
    assert "(side by side)" in done.stdout
    off = json.loads((out / "compare-sglang.json").read_text())
    on = json.loads((out / "compare-pdserve.json").read_text())
    assert str(ports[0]) in off["argv"] and str(ports[1]) in on["argv"]
    assert len(off["compare"]["pass_s"]) == 3 and len(on["compare"]["pass_s"]) == 2
    assert json.loads((out / "gate.json").read_text())["gated"] == "2 vs 3"
    assert len(json.loads((out / "records-summary-pdserve.json").read_text())["rows"]) == 6
    assert json.loads((out / "diff.json").read_text())["requests"] == 4
