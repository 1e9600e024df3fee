"""Shadow comparison, for tests: with $PDSERVE_DSA_RECORD_DIR set, every eager decode call runs SGLang's
kernel too, on the same inputs, and appends one JSON line per layer call to
`<dir>/records-<pid>.jsonl` comparing the two (the plugin's result is what the model goes on with).

It syncs the device once per record and doubles the attention work, so it is for a test harness (run the
server with --disable-cuda-graph, or with batches above the captured sizes, which run eagerly); calls
inside a CUDA-graph capture are not recorded (there is nothing to read until a replay).

Top-k rows are compared as sets (the order within a row is no contract of either kernel); attention
outputs by relative L2 error over the rows that attend to anything, against each other and, for the first
EXACT_ROWS rows, both against the fp32 reference computed from the same cache bytes (SGLang's own
quantizer wrote them, so this is the accuracy on SGLang's amax/448 scales).
"""

from __future__ import annotations

import json
import os
import threading

EXACT_ROWS = 4  # rows per call checked against the fp32 reference (it gathers topk x 576 values per row)


class Recorder:
    def __init__(self, directory: str) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"PDSERVE_DSA_RECORD_DIR={directory!r} cannot be made ({e.strerror}): point it at a "
                               "writable directory, or unset it (it is for the GPU tier's tests)") from e
        self.path = os.path.join(directory, f"records-{os.getpid()}.jsonl")
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, int], int] = {}

    @staticmethod
    def active() -> bool:
        import torch

        return not torch.cuda.is_current_stream_capturing()

    def _write(self, record: dict) -> None:
        key = (record["op"], record["layer"])
        with self._lock:
            record["call"] = self._calls.get(key, 0)
            self._calls[key] = record["call"] + 1
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")

    def topk(self, layer: int, ours, reference, lengths) -> None:
        """ours / reference: int32 [rows, topk] physical slots, -1 padded; lengths: int32 [rows]."""
        import torch

        rows = min(ours.shape[0], reference.shape[0], lengths.shape[0])
        a = ours[:rows].long().sort(dim=1).values
        b_sorted = reference[:rows].long().sort(dim=1).values
        # A slot ours holds twice counts once: duplicates can neither fill SGLang's set nor hide as a match.
        repeat = torch.zeros_like(a, dtype=torch.bool)
        repeat[:, 1:] = (a[:, 1:] == a[:, :-1]) & (a[:, 1:] >= 0)
        pos = torch.searchsorted(b_sorted, a).clamp_max(b_sorted.shape[1] - 1)
        hit = (b_sorted.gather(1, pos) == a) & (a >= 0) & ~repeat
        valid_a, valid_b = (a >= 0).sum(1), (b_sorted >= 0).sum(1)
        overlap = hit.sum(1).double() / valid_b.clamp_min(1).double()
        same = (hit.sum(1) == valid_b) & (valid_a == valid_b)
        self._write({
            "op": "indexer_topk", "layer": int(layer), "rows": rows,
            "lengths": lengths[:rows].tolist(),
            "selected_ours": valid_a.tolist(), "selected_sglang": valid_b.tolist(),
            "overlap_min": float(overlap.min()) if rows else 1.0,
            "overlap_mean": float(overlap.mean()) if rows else 1.0,
            "rows_identical_sets": int(same.sum()),
            "rows_with_repeats": int(repeat.any(1).sum()),
            "rows_selecting_another_count": int((valid_a != valid_b).sum()),
        })

    def attention(self, layer: int, variant: str, ours, reference, exact=None) -> None:
        """ours / reference: bf16 outputs of the same shape [rows, (1,) h, 512]; exact: the fp32 reference of
        the first rows ([n, h, 512]), or None."""
        import torch

        o, r = ours.float().flatten(1), reference.float().flatten(1)
        diff = (o - r)
        rows_live = r.abs().amax(1) > 0
        row_err = diff.norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)
        versus_exact = {}
        if exact is not None:
            e = exact.float().flatten(1)
            n = e.shape[0]
            norm = e.norm().clamp_min(1e-30)
            versus_exact = {"exact_rows": n, "rel_l2_ours_vs_fp32": float((o[:n] - e).norm() / norm),
                            "rel_l2_sglang_vs_fp32": float((r[:n] - e).norm() / norm)}
        self._write({**versus_exact,
            "op": "sparse_mla_decode", "variant": variant, "layer": int(layer), "rows": int(o.shape[0]),
            "rel_l2": float(diff.norm() / r.norm().clamp_min(1e-30)),
            "rel_l2_worst_row": float(row_err[rows_live].max()) if bool(rows_live.any()) else 0.0,
            "max_abs": float(diff.abs().max()) if o.numel() else 0.0,
            "nonfinite": int((~torch.isfinite(o)).sum()),
        })

