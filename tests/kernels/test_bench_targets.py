"""The benchmark table's pure parts (kernels/bench/targets.py, bench_targets.py's CPU modes, the DeepGEMM
adapter's masking), without a GPU. The JSON fixture is hand-written with fake numbers."""

import json
import pathlib
import runpy
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "bench"
FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "bench_targets_fake.json"
sys.path.insert(0, str(BENCH))

import targets  # noqa: E402


def row(us, against="us", bound=10.0, comparator_us=None, ok=True, **extra):
    t = targets.Target("sparse_mla", "v32", 1, 16, against, bound)
    r = {"kernel": "sparse_mla", "case": "v32", "B": 1, "h": 16, "us": us, "ok": ok, "check": "c",
         "target": {"against": against, "bound": bound, "text": t.text}, **extra}
    if comparator_us is not None:
        r["comparator_us"] = comparator_us
    return r


def test_targets_hold_the_issues_figures():
    by_text = {}
    for t in targets.TARGETS:
        by_text.setdefault(t.text, []).append((t.kernel, t.case, t.B, t.size))
    assert by_text == {
        "<= FlashMLA": [("sparse_mla", "v32", 64, 128), ("sparse_mla", "v4-csa", 64, 128)],
        "<= 0.9x FlashMLA": [("sparse_mla", "v32", 64, 64)],
        "<= 15 us": [("sparse_mla", "v4-csa", 64, 16)],
        "<= 10 us": [("sparse_mla", c, 1, 16) for c in targets.MLA_CASES],
        "<= 12 us": [("dsa_indexer", "top-2048", 1, 131072)],
    }


def test_plan_puts_targets_first_then_each_grid_shape_once():
    quick = targets.plan(())
    assert [targets.shape_key(r) for r in quick] == [(t.kernel, t.case, t.B, t.size) for t in targets.TARGETS]
    assert all("target" in r for r in quick)
    full = targets.plan()
    keys = [targets.shape_key(r) for r in full]
    assert keys[:len(quick)] == [targets.shape_key(r) for r in quick]
    assert len(set(keys)) == len(keys) == 6 * 4 * 4 + 5 * 4   # every target shape is also a grid shape
    assert not any("target" in r for r in full[len(quick):])
    assert {targets.shape_key(r) for r in targets.plan(["indexer"])} - {targets.shape_key(r) for r in quick} == {
        ("dsa_indexer", "top-2048", B, L) for B in targets.INDEXER_BATCHES for L in targets.INDEXER_LENGTHS
    } - {("dsa_indexer", "top-2048", 1, 131072)}
    with pytest.raises(ValueError, match="unknown grid"):
        targets.plan(["nope"])


@pytest.mark.parametrize("r, status", [
    (row(10.0), "met"),                                      # "at most": the bound itself is met
    (row(10.01), "missed"),
    (row(5.0, ok=False), "missed"),                          # fast but wrong
    (row(None, error="boom"), "not measured"),
    (row(90.0, "comparator", 0.9, comparator_us=100.0), "met"),
    (row(91.0, "comparator", 0.9, comparator_us=100.0), "missed"),
    (row(50.0, "comparator", 1.0), "not measured"),          # no comparator in the run
])
def test_evaluate(r, status):
    assert targets.evaluate(r)[0] == status


def test_evaluate_says_why():
    assert targets.evaluate(row(90.0, "comparator", 0.9, comparator_us=100.0))[1] == "0.90x"
    assert targets.evaluate(row(10.5))[1] == "10.50 us"
    assert targets.evaluate(row(5.0, ok=False))[1] == "wrong result: c"
    assert targets.evaluate({"kernel": "sparse_mla", "case": "v32", "B": 8, "h": 16, "us": 1.0}) == ("", "")


def test_markdown_from_the_fixture():
    saved = json.loads(FIXTURE.read_text())
    md = targets.render_markdown(saved["env"], saved["rows"])
    lines = md.splitlines()
    table = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| kernel |")]
    assert len(table) == len(saved["rows"])
    assert "FIXTURE" in md and "FAKE GPU" in md
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    col = {name: i for i, name in enumerate(targets.COLUMNS)}
    assert cells[0][col["ours / it"]] == "0.90" and cells[0][col["result"]].startswith("**met**")
    assert cells[0][col["% of floor"]] == "50.0%" and cells[0][col["h / L"]] == "h=128"
    assert cells[1][col["result"]].startswith("**missed**")                         # 0.95x against 0.9x
    assert "**WRONG**" in cells[2][col["check of ours (tolerance)"]]
    assert cells[2][col["result"]].startswith("**missed** (wrong result")            # 10 us, but wrong
    assert cells[3][col["result"]].startswith("**met**") and cells[3][col["comparator us"]] == ""
    assert cells[4][col["comparator us"]] == "FlashMLA: error"
    assert cells[4][col["result"]].startswith("**not measured**")
    assert cells[5][col["kernel"]] == "DSA indexer + top-2048" and cells[5][col["h / L"]] == "L=128K"
    assert cells[5][col["comparator us"]] == "DeepGEMM+topk 100.0" and cells[5][col["ours / it"]] == "0.20"
    assert cells[5][col["result"]].startswith("**missed**")                          # 20 us against 12
    assert cells[6][col["target"]] == "" and cells[6][col["result"]] == ""
    assert cells[7][col["ours us"]] == ""                                            # the row that failed
    assert cells[7][col["check of ours (tolerance)"]] == "**error**: FakeError: fake"
    assert "Targets: 2 met, 3 missed, 1 not measured (of 6)." in lines


def test_cli_markdown_from_and_dry_run_need_no_torch(capsys):
    saved = json.loads(FIXTURE.read_text())
    script = str(BENCH / "bench_targets.py")
    argv, sys.argv = sys.argv, [script, "--markdown-from", str(FIXTURE)]
    had_torch = "torch" in sys.modules
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == targets.render_markdown(saved["env"], saved["rows"]).strip()
    assert had_torch or "torch" not in sys.modules
    out = subprocess.run([sys.executable, script, "--dry-run", "--quick"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[-1] == f"{len(targets.TARGETS)} rows: 10 sparse MLA, 1 indexer, {len(targets.TARGETS)} with a target"
    assert out[0].split() == ["sparse_mla", "v32", "B=64", "h=128", "<=", "FlashMLA"]


def test_deep_gemm_adapter_masks_beyond_each_length():
    torch = pytest.importorskip("torch")
    from deepgemm_adapter import DeepGemmTopk

    B, pages, topk = 3, 4, 8
    lens = torch.tensor([40, 256, 5], dtype=torch.int32)
    logits = torch.rand((B, pages * 64))
    logits[0, 40:] = 1e9       # DeepGEMM leaves these unwritten: whatever was there, however large
    logits[2, 5:] = float("nan")
    calls = []

    class FakeDeepGemm:
        def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms):
            calls.append(("meta", tuple(context_lens.shape), block_kv, num_sms))
            return "schedule"

        def fp8_paged_mqa_logits(self, q, kv, w, context_lens, block_table, meta, max_context, clean):
            calls.append(("logits", meta, max_context, clean))
            return logits.clone()

    block_table = torch.zeros((B, pages), dtype=torch.int32)
    sel = DeepGemmTopk(FakeDeepGemm(), torch.zeros((B, 1, 64, 128)), torch.zeros((B, 64)), None, lens,
                       block_table, topk, num_sms=132)
    values, idx = sel()
    assert calls[0] == ("meta", (B, 1), 64, 132) and calls[1] == ("logits", "schedule", 256, False)
    for b in range(B):
        n = int(lens[b])
        want = torch.topk(logits[b, :n], min(topk, n)).indices
        assert set(idx[b, :min(topk, n)].tolist()) == set(want.tolist())
    assert (values[2, 5:] == float("-inf")).all()    # row 2 has 5 positions: the rest of its top-8 is masked
    assert (idx[:2] < lens[:2, None]).all()


def test_indexer_exactness_check_catches_a_wrong_set():
    torch = pytest.importorskip("torch")
    from targets_measure import is_exact_topk, set_share

    g = torch.Generator().manual_seed(0)
    scores = torch.randn((3, 1000), generator=g)
    top = torch.topk(scores, 16, dim=1).indices
    assert is_exact_topk(top, scores)
    assert is_exact_topk(top.flip(1), scores)                  # a set: order does not matter
    low = top.clone()
    low[1, 0] = torch.argmin(scores[1])                        # one position that is not among the top
    assert not is_exact_topk(low, scores)
    dup = top.clone()
    dup[2, 1] = dup[2, 0]
    assert not is_exact_topk(dup, scores)
    assert not is_exact_topk(top.masked_fill(top == top[0, 0], 1000), scores)   # out of range
    assert set_share(top, top, 1000) == 1.0
    assert set_share(low, top, 1000) == pytest.approx(1 - 1 / 48)
