"""`pdserve verify`'s router checks read each worker's own /health, not only the router's view.

The REAL router (smg 1.13.0) in front of two stand-in workers, its health checks a minute apart (the
router's own default interval): right after the prefill is killed the router still reports 2/2 healthy
workers, and the verifier must fail anyway, naming the prefill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from pd_cluster import PDCluster, write_deployment

from tests.integration.test_verify_router import by_id, verify_in_process

pytestmark = pytest.mark.integration


def test_router_checks_fail_while_the_prefill_is_down_although_the_router_says_healthy(tmp_path):
    data = tomllib.loads(write_deployment(tmp_path).read_text())
    data["router"]["health_check_interval_secs"] = 60  # the router's own default: its view goes stale
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(data))
    c = PDCluster(config, tmp_path)
    try:
        c.serve()
        code, report = verify_in_process(c.config, "--only", "router.readiness,router.workers")
        assert code == 0, report

        prefill = c.procs.pop("prefill")
        os.killpg(prefill.pid, signal.SIGKILL)
        prefill.wait(10)
        # The router has not noticed: this is the stale view the verifier used to trust.
        readiness = httpx.get(f"{c.url('router')}/readiness", timeout=10)
        assert readiness.status_code == 200 and readiness.json().get("healthy_workers") == 2, readiness.text

        code, report = verify_in_process(c.config, "--only", "router.readiness,router.workers")
        checks = by_id(report)
        assert code == 1, report
        for check_id in ("router.readiness", "router.workers"):
            check = checks[check_id]
            assert check["status"] == "fail", check
            assert "prefill /health" in check["observed"] and "no answer" in check["observed"], check
            assert "journalctl -u sglang-itest-prefill" in check["remediation"], check
    finally:
        c.stop()
