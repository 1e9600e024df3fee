"""The rows of the kernels' benchmark table (bench_targets.py), issue 19's targets, and the table's markdown.

Pure Python, no torch: the plan, the target rule and the rendering are what the CPU tests check
(tests/kernels/test_bench_targets.py), and `bench_targets.py --markdown-from` re-renders a saved run with
them on any machine.

A row is one shape: sparse MLA decode (`kernel` "sparse_mla", a case of harness.CASES, batch B, heads h) or
the DSA indexer (`kernel` "dsa_indexer", case "top-2048", batch B, length L = max_context). A measured row
adds `us` (ours, median), `default` (our launcher's kernel choice), `comparator` / `comparator_us` (FlashMLA or
DeepGEMM + mask + torch.topk, same process, same inputs), `floor_us`, `check` (text) and `ok` (the correctness
check of ours at its stated tolerance), and the `target` it is held to, if any.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MLA_CASES = ("v4-csa", "v4-hca", "v32", "v4-csa-bf16", "v4-hca-bf16", "v32-bf16")
MLA_BATCHES = (1, 8, 64, 128)
MLA_HEADS = (16, 32, 64, 128)
INDEXER_CASE = "top-2048"
INDEXER_TOPK = 2048
INDEXER_BATCHES = (1, 8, 32, 64, 128)
INDEXER_LENGTHS = (8192, 32768, 131072, 524288)
GRIDS = ("mla", "indexer")


@dataclass(frozen=True)
class Target:
    """Issue 19's bound on one shape: ours / the comparator at most `bound` (against "comparator"), or ours at
    most `bound` us (against "us")."""

    kernel: str
    case: str
    B: int
    size: int          # h for sparse MLA, L for the indexer
    against: str       # "comparator" or "us"
    bound: float

    @property
    def text(self) -> str:
        if self.against == "us":
            return f"<= {self.bound:g} us"
        return "<= FlashMLA" if self.bound == 1 else f"<= {self.bound:g}x FlashMLA"


# Issue 19, "Targets": the same run as FlashMLA, one H200.
TARGETS = (
    Target("sparse_mla", "v32", 64, 128, "comparator", 1.0),
    Target("sparse_mla", "v4-csa", 64, 128, "comparator", 1.0),
    Target("sparse_mla", "v32", 64, 64, "comparator", 0.9),
    Target("sparse_mla", "v4-csa", 64, 16, "us", 15.0),
    *(Target("sparse_mla", case, 1, 16, "us", 10.0) for case in MLA_CASES),
    Target("dsa_indexer", INDEXER_CASE, 1, 131072, "us", 12.0),
)


def shape_key(row: dict) -> tuple:
    return (row["kernel"], row["case"], row["B"], row["h"] if row["kernel"] == "sparse_mla" else row["L"])


def spec(kernel: str, case: str, B: int, size: int) -> dict:
    """A planned row: its shape and, if the issue sets one, its target."""
    row = {"kernel": kernel, "case": case, "B": B, ("h" if kernel == "sparse_mla" else "L"): size}
    for t in TARGETS:
        if (t.kernel, t.case, t.B, t.size) == shape_key(row):
            row["target"] = {**asdict(t), "text": t.text}
    return row


def grid_specs(grid: str) -> list[dict]:
    if grid == "mla":
        return [spec("sparse_mla", c, B, h) for c in MLA_CASES for B in MLA_BATCHES for h in MLA_HEADS]
    if grid == "indexer":
        return [spec("dsa_indexer", INDEXER_CASE, B, L) for L in INDEXER_LENGTHS for B in INDEXER_BATCHES]
    raise ValueError(f"unknown grid {grid!r}: one of {', '.join(GRIDS)}")


def plan(grids=GRIDS) -> list[dict]:
    """The rows to time, in table order: the targets first, then each grid's shapes not among them."""
    rows = [spec(t.kernel, t.case, t.B, t.size) for t in TARGETS]
    seen = {shape_key(r) for r in rows}
    for g in grids:
        for r in grid_specs(g):
            if shape_key(r) not in seen:
                seen.add(shape_key(r))
                rows.append(r)
    return rows


def evaluate(row: dict) -> tuple[str, str]:
    """(status, why) of a measured row against its target: "met", "missed", "not measured", or "" when the
    row has no target. A wrong result misses whatever its time."""
    t = row.get("target")
    if not t:
        return "", ""
    if row.get("us") is None:
        return "not measured", row.get("error", "ours did not run")
    if not row.get("ok"):
        return "missed", "wrong result: " + row.get("check", "no check")
    if t["against"] == "us":
        value, unit = row["us"], " us"
    elif row.get("comparator_us"):
        value, unit = row["us"] / row["comparator_us"], "x"
    else:
        return "not measured", row.get("comparator_error", "no comparator in this run")
    return ("met" if value <= t["bound"] else "missed"), f"{value:.2f}{unit}"


def _kfmt(L: int) -> str:
    return f"{L >> 20}M" if L >= (1 << 20) else f"{L >> 10}K"


def _num(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def check_cell(row: dict) -> str:
    if "error" in row and "check" not in row:
        return f"**error**: {row['error'][:120]}"
    return row.get("check", "") + ("" if row.get("ok", True) else " **WRONG**")


def table_cells(row: dict) -> list[str]:
    us, cmp_us, floor = row.get("us"), row.get("comparator_us"), row.get("floor_us")
    status, why = evaluate(row)
    mla = row["kernel"] == "sparse_mla"
    cmp_cell = ""
    if cmp_us is not None:
        cmp_cell = f"{row['comparator']} {cmp_us:.1f}"
    elif row.get("comparator_error"):
        cmp_cell = f"{row.get('comparator', 'comparator')}: error"
    return [
        "sparse MLA decode" if mla else "DSA indexer + top-2048",
        row["case"], str(row["B"]), f"h={row['h']}" if mla else f"L={_kfmt(row['L'])}",
        row.get("default", ""), _num(us, ".1f"), cmp_cell,
        "" if us is None or not cmp_us else f"{us / cmp_us:.2f}",
        _num(floor, ".1f"), "" if us is None or floor is None else f"{100 * floor / us:.1f}%",
        check_cell(row),
        row.get("target", {}).get("text", ""),
        f"**{status}** ({why})" if status else "",
    ]


COLUMNS = ("kernel", "case", "B", "h / L", "our default (splits)", "ours us", "comparator us", "ours / it",
           "floor us", "% of floor", "check of ours (tolerance)", "target", "result")


def render_markdown(env: dict, rows: list[dict]) -> str:
    """The run's table: a header naming the run (date, GPU, versions, ceilings, comparators, command), one
    line per row, and a tally of the targets."""
    head = [
        (f"Run: {env.get('date', '?')}, {env.get('gpu', '?')} ({env.get('sms', '?')} SMs), driver "
         f"{env.get('driver', '?')}, torch {env.get('torch', '?')}, {env.get('nvcc', '?')}, commit "
         f"{env.get('commit', '?')}; fatbins {env.get('fatbins', '?')}."),
        (f"Ceilings measured in this run: copy {env.get('copy_GBps', '?')} GB/s (read + write), bf16 matmul "
         f"{env.get('matmul_TFLOPs', '?')} TFLOP/s. Comparators: FlashMLA {env.get('flash_mla', '?')}; "
         f"DeepGEMM {env.get('deep_gemm', '?')}."),
        f"Command: `{env.get('command', '?')}`; median of {env.get('reps', '?')} repeats per row.",
    ]
    if env.get("note"):
        head.append(env["note"])
    lines = [*head, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    tally = [evaluate(r)[0] for r in rows if r.get("target")]
    lines += ["", (f"Targets: {tally.count('met')} met, {tally.count('missed')} missed, "
                   f"{tally.count('not measured')} not measured (of {len(tally)})."), "", LEGEND]
    return "\n".join(lines)


LEGEND = (
    "Ours: the launchers' default kernel (splits; for the indexer its path and chunk pages), median us. "
    "Comparator, same process and inputs, timed round-robin with ours: FlashMLA's sparse decode for fp8 KV "
    "(\"(h 64)\": q zero-padded to 64 heads, the padded heads' work included, as FlashMLA takes only 64 or 128), "
    "DeepGEMM fp8_paged_mqa_logits + mask + torch.topk for the indexer, none for bf16 KV. \"ours / it\" below 1: "
    "ours is faster. Floor: sparse MLA max(unique bytes / copy bandwidth, useful FLOPs / bf16 matmul rate); "
    "indexer B x L x 132 B / copy bandwidth. Check of ours: sparse MLA relative L2 against the fp32 reference "
    "over every row and max |lse error|; indexer: \"exact\" = our set is a top-k of our own fp32 scores, our "
    "scores' relative L2 against the fp32 reference (row 0) and DeepGEMM's logits (every row), and the share of "
    "DeepGEMM's set that ours holds (reported, not judged: near-ties). A row that fails its check misses its "
    "target.")
