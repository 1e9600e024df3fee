"""A unit's process tree that logs what pdserve's SGLang plugin logs, through the plugin's own writer
(kernels/python/pdserve_kernels/sglang_plugin/status.py, on PYTHONPATH): one status line from each of two
spawned "scheduler" processes (SGLang starts its schedulers with the spawn method too), then one run-time
fallback from the main process. Which kernels the statuses name is read from the file argv[1] at each
start, so a restart of the same unit can log something else. Used by test_kernel_status_journal.py."""

from __future__ import annotations

import logging
import multiprocessing
import sys
import time

RANKS = 2


def scheduler(rank: int, kernels: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s TP{rank}] %(message)s")
    from pdserve_kernels.sglang_plugin import status

    reasons = {} if kernels == status.PDSERVE else dict.fromkeys(status.OPS, "PDSERVE_DSA_KERNELS is not pdserve")
    status.log_status(status.Status(requested=kernels, kernels=dict.fromkeys(status.OPS, kernels), reasons=reasons,
                                    tp_rank=rank, device=f"cuda:{rank}", sm="9.0", sglang="0.5.23",
                                    pdserve_kernels="0.1.0"))


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        kernels = f.read().strip()
    multiprocessing.set_start_method("spawn")
    children = [multiprocessing.Process(target=scheduler, args=(rank, kernels)) for rank in range(RANKS)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    from pdserve_kernels.sglang_plugin import status

    status.FallbackLog().note("sparse_mla_decode", "v_head_dim 128 (the kernels write 512)", "(4, 16, 576)")
    print("writer: done", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
