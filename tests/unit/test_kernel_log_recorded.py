"""pdserve's reader of the kernel plugin's lines (probes.kernel_log) on real SGLang 0.5.17 server logs: the
tiny DeepSeek-V3.2 served on one H200 on 2026-12-01 (tests/gpu/dsa, results under
tests/gpu/dsa/results/2026-12-01-h200x1), with the plugin asked for (fp8 cache in decode CUDA graphs; bf16
cache eager) and not asked for. The lines sit inside SGLang's own log format among its other output."""

import pathlib

import pytest

from pdserve.probes import kernel_log

RECORDED = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


def _read(name: str) -> kernel_log.KernelLog:
    return kernel_log.parse((RECORDED / name).read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("name, variant", [("sglang-0.5.17-dsa-plugin-on.log", "fp8"),
                                           ("sglang-0.5.17-dsa-plugin-on-bf16-eager.log", "bf16")])
def test_a_server_that_asked_runs_both_of_pdserves_kernels(name, variant):
    log = _read(name)
    assert not log.unreadable and not log.fallbacks
    (status,) = log.statuses
    assert status.requested == "pdserve" and status.tp_rank == 0 and status.sm == "9.0"
    assert status.kernels == {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}
    assert {e.op for e in log.ran} == {"indexer_topk", "sparse_mla_decode"}
    assert any(variant in e.shape for e in log.ran if e.op == "sparse_mla_decode")


def test_a_server_that_did_not_ask_reports_sglangs_kernels_and_why():
    log = _read("sglang-0.5.17-dsa-plugin-off.log")
    (status,) = log.statuses
    assert status.requested == "sglang" and set(status.kernels.values()) == {"sglang"}
    assert all("not requested" in r for r in status.reasons.values()) and not log.ran
