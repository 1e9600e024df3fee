"""What the kernel benchmarks share: the timer (CUDA events, L2 evicted before every repeat, median of
round-robin repeats), the run's environment record, the two ceilings measured in the same run and the
floors derived from them, the sparse MLA decode inputs (cases, random caches, distinct indices) with their
fp32 reference, and the DSA indexer's random key pool."""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

import torch

from pdserve_kernels.reference import BLOCK_BYTES, KEY_BYTES
from pdserve_kernels.reference import PAGE as INDEXER_PAGE
from pdserve_kernels.sparse_mla_reference import LAYOUTS, make_cache, reference_decode


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - reporting only
        return f"n/a ({exc})"


def run_env(**extra) -> dict:
    """Date, GPU, driver, versions and the command line of this run (printed first, stored with the rows)."""
    props = torch.cuda.get_device_properties(0)
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props.name, "sms": props.multi_processor_count,
        "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
        "torch": torch.__version__, "nvcc": sh("nvcc --version | tail -2 | head -1"),
        "python": platform.python_version(), "command": " ".join(sys.argv),
    }
    env.update(extra)
    return env


def finish(env: dict, rows: list, json_path: str | None, print_table) -> int:
    """End of a run: its table (print_table(env, rows)), and with --json every row plus the environment."""
    print_table(env, rows)
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


def env_head(env: dict, extras: str = "") -> None:
    """The run's environment line (+ `extras`) and its command, after a blank line."""
    print()
    print(f"# {env['date']} | {env['gpu']} | driver {env['driver']} | torch {env['torch']}{extras}")
    print(f"# command: {env['command']}")


def table_head(env: dict, extras: str, columns: str) -> None:
    """A table's header: the run's environment line (+ `extras`), its command, the column row and rule."""
    env_head(env, extras)
    print(columns)
    print("|" + "---|" * (columns.count("|") - 1))


class MlaLaunchers:
    """A run's sparse MLA launchers: the production fatbin's (`fatbin`, default find_fatbin()) for every layout it
    serves, and for a layout it has no kernels for (TUNING_ONLY_LAYOUTS: V4's bf16 KV, as SGLang's V4 cache is FP8)
    the tuning fatbin's beside it (kernels/tuning/build.sh writes both into one directory), loaded on first use."""

    def __init__(self, fatbin: str | pathlib.Path | None = None) -> None:
        from pdserve_kernels.sparse_mla_decode import SparseMlaDecode

        self.production = SparseMlaDecode(fatbin=fatbin)
        self.tuning_path = self.production.path.with_name("sparse_mla_decode_tuning.fatbin")
        self._tuning = None

    def for_layout(self, layout: str):
        """The launcher that runs `layout` ("v4", "v4_bf16", ...): the production one unless it refuses the layout."""
        from pdserve_kernels.sparse_mla_decode import SparseMlaDecode, layout_refusal

        refusal = layout_refusal(layout, self.production.kernels)
        if refusal is None:
            return self.production
        if self._tuning is None:
            if not self.tuning_path.is_file():
                raise FileNotFoundError(f"{layout} runs from the tuning fatbin, {self.tuning_path}, which is not "
                                        f"there: run `bash kernels/tuning/build.sh {self.tuning_path.parent}` "
                                        f"(the production launcher: {refusal})")
            self._tuning = SparseMlaDecode(fatbin=self.tuning_path)
        return self._tuning


def probe_setup(fatbin: str):
    """A tuning probe's start: fresh random inputs, the timer, the sparse MLA module of `fatbin`, and the run's
    environment, printed as a JSON line and as env_head's header."""
    from pdserve_kernels.sparse_mla_decode import SparseMlaDecode

    env = run_env(fatbin=fatbin)
    gen, timer, mla = seeded_generator(), Timer(), SparseMlaDecode(fatbin=fatbin)
    print(json.dumps(env), flush=True)
    env_head(env)
    return gen, timer, mla, env


def row_table(extras: str, columns: str, row: str):
    """A print_table for finish(): the header, then `row` (a str.format template over a row's keys) per row."""

    def print_table(env: dict, rows: list) -> None:
        table_head(env, extras, columns)
        for r in rows:
            print(row.format(**r))

    return print_table


def seeded_generator() -> torch.Generator:
    """Fresh random inputs every run (seeded from the clock)."""
    return fixed_generator(int(datetime.datetime.now(datetime.UTC).timestamp()))


def fixed_generator(seed: int) -> torch.Generator:
    """The same random inputs every run of a tuning aid (a CUDA generator seeded with `seed`)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    return gen


class Timer:
    def __init__(self, flush_bytes: int = 512 << 20, head_start_cycles: int = 2_000_000):
        self.buf = torch.ones(flush_bytes, dtype=torch.uint8, device="cuda")
        self.head_start = head_start_cycles

    def median_us(self, fn, reps: int) -> float:
        return self.medians_us([fn], reps)[0]

    def medians_us(self, fns, reps: int, primers=None, flush: bool = True) -> list[float]:
        """Median of `reps` timings of each fn, run round-robin so clock or thermal drift hits all alike.

        Tuning modes (the benchmark uses neither): primers[i], a call of the same kernels on other inputs of the
        same shape, runs after the flush and before fn, so that fn meets its code (and launch path) warm and
        only its data cold; flush=False keeps everything of the previous repeat in L2."""
        primers = primers or [None] * len(fns)
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
        for r in range(reps):
            for fn, evs, primer in zip(fns, ev, primers, strict=False):
                s, e = evs[r]
                # Evict the previous repeat's data from L2 (50 MB) by reading 512 MB: a read leaves clean
                # lines, so the timed kernels do not pay for writing back the flush's own dirty lines.
                if flush:
                    self.buf.view(torch.int64).sum()
                if primer is not None:
                    primer()
                # ~1 ms of device sleep (outside the timed window) so the host has queued fn's launches before it
                # ends: with ~20-100 us a slow host's launch leaked into small calls' timings (30-79 us read for
                # 11-15 us calls, 2026-12-01 call 14).
                torch.cuda._sleep(self.head_start)
                s.record()
                fn()
                e.record()
        torch.cuda.synchronize()
        return [statistics.median(s.elapsed_time(e) * 1e3 for s, e in evs) for evs in ev]


def copy_bandwidth(timer: Timer) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written."""
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    t = timer.median_us(lambda: b.copy_(a), 30)
    return 2 * n / (t * 1e-6) / 1e9


def matmul_tflops(timer: Timer) -> float:
    n = 8192
    a = torch.randn((n, n), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((n, n), device="cuda", dtype=torch.bfloat16)
    t = timer.median_us(lambda: a @ b, 30)
    return 2 * n ** 3 / (t * 1e-6) / 1e12


def floor_us(bytes_: float, flops: float, copy_GBps: float, matmul_TFLOPs: float = float("inf")) -> float:
    """The physical floor of a call: its bytes at the copy bandwidth or its FLOPs at the bf16 matmul rate,
    whichever takes longer (both ceilings measured in the same run)."""
    return max(bytes_ / (copy_GBps * 1e9), flops / (matmul_TFLOPs * 1e12)) * 1e6


# ---- DSA indexer inputs ----

def indexer_pool(n_blocks: int, gen) -> torch.Tensor:
    """A paged FP8 key pool [n_blocks, 64, 1, 132]: random e4m3 keys, positive fp32 scales."""
    kv = torch.empty((n_blocks, BLOCK_BYTES), dtype=torch.uint8, device="cuda")
    step = 1 << 16
    for lo in range(0, n_blocks, step):
        hi = min(n_blocks, lo + step)
        kv[lo:hi, :KEY_BYTES] = torch.randn((hi - lo, KEY_BYTES), device="cuda", generator=gen).to(
            torch.float8_e4m3fn).view(torch.uint8)
        kv[lo:hi, KEY_BYTES:] = (torch.rand((hi - lo, INDEXER_PAGE), device="cuda", generator=gen) * 0.03
                                 + 0.005).view(torch.uint8).view(hi - lo, INDEXER_PAGE * 4)
    return kv.view(n_blocks, INDEXER_PAGE, 1, 132)


def random_pages(pool_blocks: int, B: int, L: int, gen) -> torch.Tensor:
    """B x L / INDEXER_PAGE distinct pages at random positions of a pool of pool_blocks (for indexer_requests)."""
    return torch.randperm(pool_blocks, device="cuda", generator=gen)[:B * L // INDEXER_PAGE]


def indexer_requests(B: int, L: int, gen, pages: torch.Tensor):
    """Inputs of B requests of L positions on the given B x L / INDEXER_PAGE pages: q, weights, context lengths,
    block table."""
    q = torch.randn((B, 1, 64, 128), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn((B, 64), device="cuda", generator=gen) / 8
    ctx = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, w, ctx, pages.int().view(B, L // INDEXER_PAGE)


def indexer_key_bytes(B: int, L: int) -> int:
    """The bytes an indexer call must read: every key of every request (132 B per key)."""
    return B * L * 132


# ---- sparse MLA decode inputs ----

PAGE = 64
CASES = {  # name -> (layout, selected from the main cache, window entries from the extra cache)
    "v4-csa": ("v4", 512, 128),
    "v4-hca": ("v4", 1024, 128),
    "v32": ("v32", 2048, 0),
    "v4-csa-bf16": ("v4_bf16", 512, 128),
    "v4-hca-bf16": ("v4_bf16", 1024, 128),
    "v32-bf16": ("v32_bf16", 2048, 0),
}


def random_pool(layout, n_entries: int, gen):
    """A cache with random finite entries everywhere (benchmark inputs; the tests use NaN poisoning)."""
    nb = n_entries // PAGE
    buf, view = make_cache(torch, layout, nb, PAGE, "cuda")
    step = 2048
    for lo in range(0, nb, step):
        hi = min(nb, lo + step)
        n = hi - lo
        if layout.bf16:
            eb = layout.entry_bytes
            buf[lo:hi, :PAGE * eb].view(n, PAGE, eb)[:] = torch.randn(
                (n, PAGE, layout.dqk), device="cuda", generator=gen).to(torch.bfloat16).view(torch.uint8)
        elif layout.name == "v4":
            data = buf[lo:hi, :PAGE * 576].view(n, PAGE, 576)
            data[:, :, :448] = torch.randn((n, PAGE, 448), device="cuda", generator=gen).to(
                torch.float8_e4m3fn).view(torch.uint8)
            data[:, :, 448:] = torch.randn((n, PAGE, 64), device="cuda", generator=gen).to(
                torch.bfloat16).view(torch.uint8)
            sc = buf[lo:hi, PAGE * 576:PAGE * 584].view(n, PAGE, 8)
            sc[:, :, :7] = torch.randint(121, 127, (n, PAGE, 7), device="cuda", generator=gen).to(torch.uint8)
        else:
            data = buf[lo:hi, :PAGE * 656].view(n, PAGE, 656)
            data[:, :, :512] = torch.randn((n, PAGE, 512), device="cuda", generator=gen).to(
                torch.float8_e4m3fn).view(torch.uint8)
            e = torch.randint(-6, 0, (n, PAGE, 4), device="cuda", generator=gen).float()
            data[:, :, 512:528] = torch.exp2(e).view(torch.uint8)
            data[:, :, 528:] = torch.randn((n, PAGE, 64), device="cuda", generator=gen).to(
                torch.bfloat16).view(torch.uint8)
    return buf, view


def distinct_indices(rows: int, k: int, pool: int, gen):
    return torch.stack([torch.randperm(pool, device="cuda", generator=gen)[:k] for _ in range(rows)]).int()


@dataclass
class MlaShape:
    """One benchmark shape: a case at batch B and h heads, its inputs, and calls of the launcher on them."""

    case: str
    B: int
    h: int
    layout: str
    q: torch.Tensor
    kv: torch.Tensor
    buf: torch.Tensor              # kv's raw cache (the reference reads it)
    ind: torch.Tensor
    win_buf: torch.Tensor | None
    win_ind: torch.Tensor | None
    extra: dict
    sinks: torch.Tensor
    sm_scale: float
    n_valid: int                   # entries per row (selected + window)
    unique_entries: int            # distinct entries over the batch (the bytes a kernel must read)

    @property
    def lay(self):
        return LAYOUTS[self.layout]

    def call(self, mla, **kw):
        """A no-argument call of `mla` on this shape (kernel=, splits=, variant=, ... passed on)."""
        return lambda: mla(self.q, self.kv, self.ind, self.sm_scale, layout=self.layout, sinks=self.sinks,
                           **self.extra, **kw)

    def reference(self, rows: int | None = None):
        """(out, lse) of the fp32 reference on the first `rows` rows (default: all)."""
        r = self.B if rows is None else min(self.B, rows)
        return reference_decode(self.lay, self.q[:r].view(r, self.h, self.lay.dqk), self.buf, PAGE,
                                self.ind[:r].view(r, -1), self.sm_scale, self.sinks, extra_cache=self.win_buf,
                                extra_page=PAGE,
                                extra_indices=self.win_ind[:r].view(r, -1) if self.win_ind is not None else None)

    def rel_err(self, out, ref_out) -> float:
        r = ref_out.shape[0]
        o = out[:r].reshape(r, self.h, 512).float()
        return ((o - ref_out).norm() / ref_out.norm()).item()

    def bytes_flops(self) -> tuple[int, int]:
        """Unique bytes (distinct selected entries + q + out + lse + indices) and useful FLOPs
        (2 h N (d_qk + 512) per row, N = valid entries) of one call on this shape."""
        lay = self.lay
        bytes_ = (self.unique_entries * lay.entry_bytes + self.B * self.h * (lay.dqk * 2 + 512 * 2 + 4)
                  + self.B * self.n_valid * 4)
        return bytes_, 2 * self.B * self.h * self.n_valid * (lay.dqk + 512)


def mla_pool(name: str, layout: str, n_entries: int, pools: dict, gen):
    """The random cache `name` (made on first use, then shared by every shape of the run)."""
    if name not in pools:
        pools[name] = random_pool(LAYOUTS[layout], n_entries, gen)
    return pools[name]


def mla_batch(case: str, B: int, heads, gen, pools: dict, k_main: int | None = None):
    """The shapes of `case` at batch B for each of `heads` (one query token per request, page 64): fresh
    distinct indices per batch, fresh q per head count, random caches of 2^20 entries (window caches 2^17)
    kept in `pools` across calls. k_main: entries selected from the main cache instead of the case's."""
    layout, case_k_main, k_win = CASES[case]
    k_main = case_k_main if k_main is None else k_main
    lay = LAYOUTS[layout]
    buf, kv = mla_pool(layout, layout, 1 << 20, pools, gen)
    win_buf, win = mla_pool("win-" + layout, layout, 1 << 17, pools, gen) if k_win else (None, None)
    ind = distinct_indices(B, k_main, kv.shape[0] * PAGE, gen).view(B, 1, k_main)
    win_ind = distinct_indices(B, k_win, win.shape[0] * PAGE, gen).view(B, 1, k_win) if k_win else None
    uniq = torch.unique(ind).numel() + (torch.unique(win_ind).numel() if k_win else 0)
    extra = {"extra_kv": win, "extra_indices": win_ind} if k_win else {}
    for h in heads:
        q = torch.randn((B, 1, h, lay.dqk), device="cuda", generator=gen).to(torch.bfloat16)
        sinks = torch.randn((h,), device="cuda", generator=gen)
        yield MlaShape(case=case, B=B, h=h, layout=layout, q=q, kv=kv, buf=buf, ind=ind, win_buf=win_buf,
                       win_ind=win_ind, extra=extra, sinks=sinks, sm_scale=lay.dqk ** -0.5,
                       n_valid=k_main + k_win, unique_entries=uniq)


def mla_shapes(cases, batches, heads, gen):
    """The shapes of `cases` x `batches` x `heads` (see mla_batch), the caches of a layout shared by all."""
    pools = {}
    for case in cases:
        for B in batches:
            yield from mla_batch(case, B, heads, gen, pools)
