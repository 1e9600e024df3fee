"""Launcher for the DSA lightning indexer + exact top-k kernel (kernels/dsa_indexer/dsa_indexer.cu).

Conventions (the same as DeepGEMM's ``fp8_paged_mqa_logits`` so callers can swap them):

* ``q``: fp8 e4m3 ``[B, next_n, 64, 128]`` (``torch.float8_e4m3fn``, or ``uint8`` holding those bytes);
  q's per-vector scale is folded into ``weights``.
* ``weights``: fp32 ``[B * next_n, 64]``.
* ``kv_cache``: uint8 (or fp8) paged index-key cache, ``[num_blocks, 64, 1, 132]``, ``[num_blocks, 64, 132]``
  or ``[num_blocks, 8448]``; each 64-token block holds 64 x 128 fp8 keys first, then 64 fp32 scales.
* ``context_lens``: int32 ``[B]`` or ``[B, next_n]``. With ``[B]``, token ``j`` of request ``b`` sees
  ``context_lens[b] - next_n + 1 + j`` keys (the last query token sees all of them; DeepGEMM's causal
  rule). With ``[B, next_n]`` each token's length is given explicitly.
* ``block_table``: int32 ``[B, max_blocks]``; entries past ``ceil(len / 64)`` are never dereferenced (the early
  kernels read, and ignore, the table's entries up to ``ceil(max_len / 64)``: any values there are fine).

Returns int32 ``[B * next_n, topk]``: positions (0-based, within the request) of the ``topk`` largest
scores ``k_scale[s] * sum_h w[h] * relu(q[h] . k[s])``. Rows longer than ``topk`` hold an unordered set;
scores equal to the k-th one bit-for-bit are chosen arbitrarily. Rows of length ``n <= topk`` hold
``0..n-1`` then ``-1``.

``max_len`` is a host-side upper bound on every length (e.g. the scheduler's longest request); the
workspace (12 B per position: fp32 scores and a candidate list) and the grids are sized from it, never from the
block table's width. If omitted it is read from ``context_lens`` (one device-to-host sync). Lengths above ``max_len``
are clamped to it: passing a wrong bound gives wrong results, not memory errors.

The workspace (histograms and counters, left zeroed by each call; scores and candidates) is kept per stream,
so calls on different streams may overlap. The launch plan (chunk size, grids, workspace size) is pure host
arithmetic, ``plan_dsa``; the serving API (``pdserve_kernels.ops``: a torch.library op, a plan made once per
batch, a static workspace) uses the same plan and launch without a host sync.

Two paths compute the same thing (``path=``): ``"split"`` launches the scoring grid, then the selection
grid (PDL); ``"fused"`` is one cooperative launch whose CTAs, once every CTA of the request has scored
its chunk, select from their own scores in shared memory (the last one resolves the ties). ``"fused"``
needs the whole grid resident at once, so it is for small batches (ValueError when it does not fit).
``None`` (default) is ``"split"``: on H200 the fused path measured slower than the split one at B=1
(28.0 vs 21.8 us at L=128K; kernels/NOTES.md, "Fused single launch"), so it is opt-in only.

The split path has two kernel variants (``early=``, a plan field): the base kernels, and the small-batch
("early") ones, which take dependent global round trips off the chain (the scoring CTA reads its block-table
entries with the lengths and requests its first 6 pages at once, then keeps 5 ahead as the base does; the
selection reads the lengths before waiting for the scoring grid, re-reads tied scores from shared memory, and
needs fewer atomics' round trips), planned with chunks for one wave of 3 scoring CTAs per SM
(``early_chunk_pages``). ``DEFAULT_EARLY`` says which one a plan takes when not told; kernels/NOTES.md
("Small-batch variants") says how it is to be chosen.
``cluster=True`` (implies early) launches the selection as one thread-block cluster per row, whose CTAs reserve
output space and hand over tied candidates in distributed shared memory instead of global atomics (rows up to
CLUSTER_MAX x CLUSTER_SUBS x 4096 = 128K positions; ValueError beyond; sm_90 only). ``cluster=None`` (default)
takes it where it measured faster: on a GPU that has it, for the early kernels, when rows x max_len is at most
CLUSTER_AUTO_POSITIONS (kernels/NOTES.md "Small-batch variants").
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from dataclasses import dataclass

from ._driver import Module, locate_fatbin
from ._launcher import DeviceKernels, PerDevice
from ._metadata import KernelTable, load_table, metadata_path

# The input contract. The kernels' own values come with the fatbin's metadata (dsa_indexer.json, written by
# kernels/build.sh from dsa_indexer.h); DsaIndexer refuses a fatbin whose constants differ from these.
HEADS = 64
DIM = 128
PAGE = 64
BLOCK_BYTES = PAGE * (DIM + 4)  # 8448
SELECT_CHUNK = 4096
MAX_CHUNK_PAGES = 1023  # the scoring CTA's histogram counts are 16-bit
BINS1 = 4096
CTR = 8            # ints per row of the counters workspace (kCtr)
MAX_SUBS = 16      # kMaxSubs
CLUSTER_MAX = 16   # kClusterMax: CTAs per row in the cluster select (above 8: a non-portable cluster size)
CLUSTER_SUBS = 2   # kClusterSubs: 4096-score sub-chunks per cluster-select CTA
CONSTANTS = {"heads": HEADS, "dim": DIM, "page": PAGE, "select_chunk": SELECT_CHUNK, "bins1": BINS1, "ctr": CTR,
             "max_subs": MAX_SUBS, "max_chunk_pages": MAX_CHUNK_PAGES, "cluster_max": CLUSTER_MAX,
             "cluster_subs": CLUSTER_SUBS}
FUSED_MAX_CHUNK_PAGES = 64           # the fused path keeps a CTA's scores in smem: next_n * 16 KB at most
# Which split-path variant a plan takes when not told (early=None): the early kernels, measured faster at small
# batch and not slower at large (kernels/tuning/bench_small_batch.py, H200, 2026-12-01 call 16: B=1 1.02-1.10x,
# B=8 1.00-1.09x, B=64 1.00-1.02x; kernels/NOTES.md "Small-batch variants").
DEFAULT_EARLY = True
# Where cluster=None takes the cluster select: rows x max_len up to 2^20 positions. Measured on H200
# (bench_small_batch.py, 2026-12-01 call 16 and 2026-12-02 call 1, us, early select / cluster select): faster at
# every B=1 and B=8 row
# (B=1 L=128K 23.4 / 21.0, B=8 L=128K 69.9 / 68.9) and at B=64 L=8K (38.9 / 36.4), slower from 2^21 (B=64 L=32K
# 104.1 / 105.5, L=128K 316.1 / 326.6).
CLUSTER_AUTO_POSITIONS = 1 << 20


class _Params(ctypes.Structure):
    # Mirrors struct DsaParams in dsa_indexer.h (pointers first, then ints); checked against the metadata.
    _fields_ = [
        ("q", ctypes.c_void_p), ("weights", ctypes.c_void_p), ("kv", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p), ("block_table", ctypes.c_void_p), ("scores", ctypes.c_void_p),
        ("cand", ctypes.c_void_p), ("ghist", ctypes.c_void_p), ("ctr", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("next_n", ctypes.c_int), ("ctx_mode", ctypes.c_int),
        ("max_blocks", ctypes.c_int), ("topk", ctypes.c_int), ("chunk_pages", ctypes.c_int),
        ("len_stride", ctypes.c_int), ("select_subs", ctypes.c_int),
    ]


def find_fatbin() -> pathlib.Path:
    return locate_fatbin("dsa_indexer", "PDSERVE_KERNELS_FATBIN")


def load_kernel_table(fatbin: str | os.PathLike | None = None) -> KernelTable:
    """The metadata of `fatbin` (default: find_fatbin()), from the .json the build wrote next to it."""
    table = load_table(metadata_path(fatbin or find_fatbin()), "dsa_indexer")
    if table.constants != CONSTANTS:
        raise RuntimeError(f"{table.path}: the kernels were built with {table.constants}, this launcher expects "
                           f"{CONSTANTS}: rebuild the kernels with kernels/build.sh")
    return table


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


STATE_INTS_PER_ROW = BINS1 + CTR          # the zero-kept part of the workspace: a row's histogram and counters
SCRATCH_INTS_PER_POSITION = 3             # fp32 score + (uint2) candidate entry per position of a row


def default_chunk_pages(batch: int, max_len: int, num_sms: int) -> int:
    """Pages per scoring CTA: enough to amortise its setup, few enough that every SM gets work at small batch
    (about two CTAs per SM; measured best on H200 within 10% at B=1..128, kernels/NOTES.md)."""
    pages = batch * ((max_len + PAGE - 1) // PAGE)
    per_cta = -(-pages // (num_sms * 2))
    return max(2, min(32, per_cta))


def early_chunk_pages(batch: int, max_len: int, num_sms: int, next_n: int = 1) -> int:
    """Pages per scoring CTA for the early kernels: one wave of as many CTAs per SM as their shared memory
    allows on Hopper (three at next_n = 1, two at next_n = 2), so at B=1 L=128K each CTA has 6 pages, all in
    flight from the start (the early pipeline requests its first 6 at once); from B=8 at 128K both policies
    give 32 pages."""
    pages = batch * ((max_len + PAGE - 1) // PAGE)
    per_cta = -(-pages // (num_sms * (3 if next_n == 1 else 2)))
    return max(2, min(32, per_cta))


@dataclass(frozen=True)
class DsaPlan:
    """The launch of one indexer call, from what the caller knows before the step (no tensor is read):
    batch, next_n, top-k, an upper bound on every length and the GPU's SM count. The same plan serves
    every layer of a step; the kernels read the actual lengths on the device."""

    batch: int
    next_n: int
    topk: int
    max_len: int          # clamped to [1, max_blocks * 64]
    len_stride: int       # positions per row in the scratch: max_len rounded up to 4096
    chunk_pages: int      # pages per scoring CTA
    n_chunks: int         # scoring grid x
    runs: int             # 4096-position runs per row
    select_subs: int      # runs per select CTA
    early: bool = False   # the split path's small-batch kernels (dsa_score_early_*, dsa_select_early)
    cluster: bool = False  # with early: the selection as one cluster per row (dsa_select_cluster)

    def score_kernel(self, impl: str) -> str:
        return f"dsa_score_{'early_' if self.early else ''}{impl}_n{self.next_n}"

    @property
    def select_kernel(self) -> str:
        return "dsa_select_cluster" if self.cluster else "dsa_select_early" if self.early else "dsa_select"

    @property
    def select_cluster(self) -> int | None:
        """CTAs per cluster of the select launch: the row's CTAs (None: not a cluster launch)."""
        return self.select_grid[0] if self.cluster else None

    @property
    def rows(self) -> int:
        return self.batch * self.next_n

    @property
    def score_grid(self) -> tuple[int, int, int]:
        return (self.n_chunks, self.batch, 1)

    @property
    def select_grid(self) -> tuple[int, int, int]:
        return (-(-self.runs // self.select_subs), self.rows, 1)

    @property
    def state_ints(self) -> int:
        return self.rows * STATE_INTS_PER_ROW

    @property
    def scratch_ints(self) -> int:
        return self.rows * self.len_stride * SCRATCH_INTS_PER_POSITION


def plan_dsa(batch: int, next_n: int, topk: int, max_len: int, num_sms: int, *, max_blocks: int | None = None,
             chunk_pages: int | None = None, select_subs: int | None = None, early: bool | None = None,
             cluster: bool | None = None, cluster_capable: bool = False) -> DsaPlan:
    """The plan for `batch` requests of `next_n` query tokens whose lengths are all <= max_len (a host int:
    the scheduler's longest request, or under CUDA graphs the captured bound). `early` picks the split path's
    kernel variant (None: DEFAULT_EARLY) and, without a `chunk_pages`, its chunk policy; `cluster` the cluster
    select (implies early; None: where it measured faster, if `cluster_capable`, the GPU has it, and neither
    early=False nor a select_subs rules it out). Raises ValueError on bad input."""
    for name, v in (("batch", batch), ("topk", topk), ("num_sms", num_sms)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if next_n not in (1, 2):
        raise ValueError(f"next_n must be 1 or 2, got {next_n!r}")
    if not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"max_len must be a non-negative int (an upper bound of the lengths), got {max_len!r}")
    if cluster is not None and not isinstance(cluster, bool):
        raise ValueError(f"cluster must be a bool or None, got {cluster!r}")
    if not isinstance(cluster_capable, bool):
        raise ValueError(f"cluster_capable must be a bool, got {cluster_capable!r}")
    max_len = max(1, max_len if max_blocks is None else min(max_len, max_blocks * PAGE))
    if cluster is None:
        cluster = (cluster_capable and early is not False and select_subs is None
                   and max_len <= CLUSTER_MAX * CLUSTER_SUBS * SELECT_CHUNK
                   and batch * next_n * max_len <= CLUSTER_AUTO_POSITIONS)
    if early is None:
        early = DEFAULT_EARLY or cluster
    if not isinstance(early, bool) or (cluster and not early):
        raise ValueError(f"early must be a bool or None (True with cluster=True), got {early!r}")
    len_stride = _round_up(max_len, SELECT_CHUNK)
    if chunk_pages is None:
        chunk_pages = (early_chunk_pages(batch, max_len, num_sms, next_n) if early
                       else default_chunk_pages(batch, max_len, num_sms))
    if not 1 <= chunk_pages <= MAX_CHUNK_PAGES:
        raise ValueError(f"chunk_pages must be in [1, {MAX_CHUNK_PAGES}], got {chunk_pages}")
    rows = batch * next_n
    runs = len_stride // SELECT_CHUNK
    if select_subs is None and cluster:   # the fewest runs per CTA that keep a row within one cluster
        select_subs = -(-runs // CLUSTER_MAX)
    if select_subs is None:   # select CTAs: one wave of ~3 per SM, each covering `subs` runs of 4096 scores
        select_subs = max(1, min(MAX_SUBS, -(-rows * runs // (3 * num_sms))))
    max_subs = CLUSTER_SUBS if cluster else MAX_SUBS
    if not 1 <= select_subs <= max_subs:
        raise ValueError(f"select_subs must be in [1, {max_subs}]" + (" with cluster=True" if cluster else "")
                         + f", got {select_subs}" + (f" (max_len {max_len}: the cluster select covers rows of up to "
                                                     f"{CLUSTER_MAX * CLUSTER_SUBS * SELECT_CHUNK} positions)"
                                                     if cluster else ""))
    if cluster and -(-runs // select_subs) > CLUSTER_MAX:
        raise ValueError(f"select_subs={select_subs} gives {-(-runs // select_subs)} CTAs per row, more than one "
                         f"cluster of {CLUSTER_MAX}")
    n_chunks = -(-((max_len + PAGE - 1) // PAGE) // chunk_pages)
    return DsaPlan(batch=batch, next_n=next_n, topk=topk, max_len=max_len, len_stride=len_stride,
                   chunk_pages=chunk_pages, n_chunks=n_chunks, runs=runs, select_subs=select_subs, early=early,
                   cluster=cluster)


class DsaIndexer(DeviceKernels):
    """Holds the loaded module for one device and a zero-kept workspace per stream; call it like the function."""

    def __init__(self, device=None, fatbin: str | os.PathLike | None = None) -> None:
        super().__init__(device, pathlib.Path(fatbin) if fatbin else find_fatbin(), load_kernel_table, _Params)
        # Dynamic shared memory to opt in to: the largest each kernel is launched with.
        self.module = Module(self.path.read_bytes(), self.device.index,
                             {n: k.smem_bytes(FUSED_MAX_CHUNK_PAGES) for n, k in self.kernels.kernels.items()})
        # The cluster select is built and tuned for Hopper, whose clusters go up to 16 CTAs (a non-portable size).
        self.cluster_ok = self.capability == (9, 0)
        if self.cluster_ok and CLUSTER_MAX > 8:
            for name, k in self.kernels.kernels.items():
                if k.shape.get("cluster"):
                    self.module.allow_nonportable_cluster(name)
        self.default_impl = "wgmma" if self.capability == (9, 0) else "mma"
        self._states: dict[int, object] = {}   # per stream: int32 [rows_cap * (4096 + 8)], kept zeroed

    def _state(self, rows: int):
        """The zero-kept histograms and counters of the current stream (>= rows rows). Each stream has its own,
        so calls on two streams may overlap; on one stream they are ordered."""
        torch = self.torch
        key = torch.cuda.current_stream(self.device).cuda_stream
        with self._lock:
            state = self._states.get(key)
            if state is None or state.numel() < rows * STATE_INTS_PER_ROW:
                cap = max(rows, 2 * (state.numel() // STATE_INTS_PER_ROW) if state is not None else 0, 64)
                state = torch.zeros(cap * STATE_INTS_PER_ROW, dtype=torch.int32, device=self.device)
                self._states[key] = state
        return state

    def reset_workspace(self) -> None:
        """Zero the workspaces (only needed after a launch that did not finish, e.g. a device error)."""
        with self._lock:
            for state in self._states.values():
                state.zero_()

    def default_chunk_pages(self, batch: int, max_len: int, next_n: int) -> int:
        return default_chunk_pages(batch, max_len, self.num_sms)

    def plan(self, batch: int, next_n: int, topk: int, max_len: int, **kw) -> DsaPlan:
        """plan_dsa for this GPU (see there)."""
        return plan_dsa(batch, next_n, topk, max_len, self.num_sms, cluster_capable=self.cluster_ok, **kw)

    def fused_chunk_pages(self, batch: int, max_len: int, next_n: int, impl: str,
                          chunk_pages: int | None = None, grow: bool = True) -> int | None:
        """Chunk size for the fused path whose whole grid is resident at once, or None if there is none.

        Starts from `chunk_pages` (default: default_chunk_pages); with `grow`, tries larger chunks (up to
        FUSED_MAX_CHUNK_PAGES) until ceil(pages / chunk) * batch CTAs fit on the GPU.
        """
        name = f"dsa_fused_{impl}_n{next_n}"
        kernel = self.kernels[name]
        pages = max(1, (max_len + PAGE - 1) // PAGE)
        c = chunk_pages if chunk_pages is not None else self.default_chunk_pages(batch, max_len, next_n)
        while c <= FUSED_MAX_CHUNK_PAGES:
            smem = kernel.smem_bytes(c)
            key = (name, smem)
            if key not in self._occ:
                self._occ[key] = self.module.max_active_blocks(name, kernel.threads, smem)
            if -(-pages // c) * batch <= self._occ[key] * self.num_sms:
                return c
            if not grow:
                return None
            c += 1
        return None

    def check_impl(self, impl: str | None) -> str:
        if impl is None:
            return self.default_impl
        if impl not in ("wgmma", "mma"):
            raise ValueError(f"impl must be 'wgmma' or 'mma', got {impl!r}")
        if impl == "wgmma" and self.capability != (9, 0):
            major, minor = self.capability
            raise ValueError(f"impl='wgmma' needs an sm_90 GPU, this one is sm_{major}{minor}")
        return impl

    def launch(self, plan: DsaPlan, impl: str, q, weights, kv_cache, context_lens, block_table, *, out, scores_ptr: int,
               cand_ptr: int, state, pdl: bool | None = None, fused: bool = False, select: bool = True,
               cooperative: bool = True) -> None:
        """Queue one call on the current stream: no allocation, no host sync, no planning. The inputs must
        have passed _check_inputs and match `plan`; `state` holds >= plan.rows zeroed rows (histogram, counters:
        `state.numel() // (4096 + 8)` rows, histograms first) and is left zeroed when the launches complete."""
        cap = state.numel() // STATE_INTS_PER_ROW
        p = _Params(
            q=q.data_ptr(), weights=weights.data_ptr(), kv=kv_cache.data_ptr(), ctx=context_lens.data_ptr(),
            block_table=block_table.data_ptr(), scores=scores_ptr, cand=cand_ptr,
            ghist=state.data_ptr(), ctr=state.data_ptr() + 4 * cap * BINS1, out=out.data_ptr(),
            batch=plan.batch, next_n=plan.next_n, ctx_mode=0 if context_lens.dim() == 1 else 1,
            max_blocks=block_table.shape[1], topk=plan.topk, chunk_pages=plan.chunk_pages,
            len_stride=plan.len_stride, select_subs=plan.select_subs)
        stream = self.torch.cuda.current_stream(self.device).cuda_stream
        if fused:
            # One launch; the kernel waits for all CTAs of a request, so all must be resident.
            k = self.kernels[f"dsa_fused_{impl}_n{plan.next_n}"]
            self.module.launch(k.name, plan.score_grid, k.threads, k.smem_bytes(plan.chunk_pages), stream, p,
                               cooperative=cooperative)  # False: tuning experiments only
            return
        if plan.cluster and not self.cluster_ok:
            raise ValueError(f"cluster=True needs an sm_90 GPU (clusters of {CLUSTER_MAX} CTAs), this one is "
                             f"sm_{self.capability[0]}{self.capability[1]}")
        k = self.kernels[plan.score_kernel(impl)]
        self.module.launch(k.name, plan.score_grid, k.threads, k.smem_bytes(), stream, p)
        if select:  # False only to time the scoring pass alone (benchmark breakdown)
            # Programmatic dependent launch (sm_90+): the select grid is scheduled while the scoring
            # grid drains and waits in-kernel (griddepcontrol.wait) for its results.
            use_pdl = self.capability[0] >= 9 if pdl is None else pdl
            k = self.kernels[plan.select_kernel]
            self.module.launch(k.name, plan.select_grid, k.threads, k.smem_bytes(), stream, p, programmatic=use_pdl,
                               cluster=plan.select_cluster)

    def __call__(self, q, weights, kv_cache, context_lens, block_table, topk: int, *, max_len: int | None = None,
                 out=None, scores=None, return_scores: bool = False, impl: str | None = None,
                 chunk_pages: int | None = None, pdl: bool | None = None, path: str | None = None,
                 early: bool | None = None, cluster: bool | None = None, _select: bool = True,
                 _cooperative: bool = True):
        torch = self.torch
        _check_inputs(torch, self.device, q, weights, kv_cache, context_lens, block_table, topk)
        B, next_n = q.shape[0], q.shape[1]
        rows = B * next_n
        max_blocks = block_table.shape[1]
        if max_len is None:  # convenience for tests and benchmarks: one device-to-host sync (ops.py has none)
            max_len = int(context_lens.max().item()) if context_lens.numel() else 0
        max_len = max(1, min(int(max_len), max_blocks * PAGE))
        impl = self.check_impl(impl)
        if path not in (None, "fused", "split"):
            raise ValueError(f"path must be None, 'fused' or 'split', got {path!r}")
        if path == "fused" and (early or cluster):
            raise ValueError("early=True / cluster=True pick the split path's small-batch kernels; "
                             "the fused path has none")
        fused_chunk = None
        if path == "fused" and _select:
            # Fused single launch: its grid must fit on the GPU at once; without an explicit chunk size
            # the chunk grows from the default until it does.
            fused_chunk = self.fused_chunk_pages(B, max_len, next_n, impl, chunk_pages, grow=chunk_pages is None)
            if fused_chunk is None:
                raise ValueError(
                    f"path='fused' needs the whole grid resident at once: B={B}, max_len={max_len}"
                    + (f", chunk_pages={chunk_pages}" if chunk_pages is not None else "")
                    + f" does not fit with chunks of <= {FUSED_MAX_CHUNK_PAGES} pages; use path='split'")
            chunk_pages = fused_chunk
        plan = self.plan(B, next_n, topk, max_len, chunk_pages=chunk_pages,
                         early=False if fused_chunk is not None else early, cluster=cluster)
        len_stride = plan.len_stride
        if scores is None:
            scores = torch.empty((rows, len_stride), dtype=torch.float32, device=self.device)
        elif (scores.dtype != torch.float32 or tuple(scores.shape) != (rows, len_stride)
              or not scores.is_contiguous() or scores.device != self.device):
            raise ValueError(f"scores must be a contiguous float32 tensor of shape {(rows, len_stride)} on "
                             f"{self.device}, got {scores.dtype} {tuple(scores.shape)} on {scores.device}")
        if out is None:
            out = torch.empty((rows, topk), dtype=torch.int32, device=self.device)
        elif (out.dtype != torch.int32 or tuple(out.shape) != (rows, topk) or not out.is_contiguous()
              or out.device != self.device):
            raise ValueError(f"out must be a contiguous int32 tensor of shape {(rows, topk)} on {self.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        cand = torch.empty((rows, len_stride, 2), dtype=torch.int32, device=self.device)
        self.launch(plan, impl, q, weights, kv_cache, context_lens, block_table, out=out,
                    scores_ptr=scores.data_ptr(), cand_ptr=cand.data_ptr(), state=self._state(rows), pdl=pdl,
                    fused=fused_chunk is not None, select=_select, cooperative=_cooperative)
        self.last_path = ("fused" if fused_chunk is not None else "split", plan.chunk_pages)
        self.last_plan = plan
        if return_scores:
            return out, scores
        return out


def _check_inputs(torch, device, q, weights, kv_cache, context_lens, block_table, topk) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(msg)

    fp8 = getattr(torch, "float8_e4m3fn", None)
    for name, t in (("q", q), ("weights", weights), ("kv_cache", kv_cache), ("context_lens", context_lens),
                    ("block_table", block_table)):
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
        need(t.device == device, f"{name} is on {t.device}, expected {device}")
        need(t.is_contiguous(), f"{name} must be contiguous (call .contiguous())")
    need(q.dim() == 4 and q.shape[1] in (1, 2) and tuple(q.shape[2:]) == (HEADS, DIM),
         f"q must have shape [B, next_n in (1, 2), {HEADS}, {DIM}], got {tuple(q.shape)}")
    need(q.dtype in (fp8, torch.uint8), f"q must be float8_e4m3fn (or uint8 bytes of it), got {q.dtype}")
    B, next_n = q.shape[0], q.shape[1]
    need(B >= 1, "batch must be >= 1")
    need(weights.dtype == torch.float32 and tuple(weights.shape) == (B * next_n, HEADS),
         f"weights must be float32 [{B * next_n}, {HEADS}], got {weights.dtype} {tuple(weights.shape)}")
    need(kv_cache.dtype in (fp8, torch.uint8), f"kv_cache must be uint8 or float8_e4m3fn, got {kv_cache.dtype}")
    shape = tuple(kv_cache.shape)
    need(shape[1:] in ((PAGE, 1, DIM + 4), (PAGE, DIM + 4), (BLOCK_BYTES,)),
         f"kv_cache must be [num_blocks, 64, 1, 132], [num_blocks, 64, 132] or [num_blocks, 8448], got {shape}")
    need(kv_cache.data_ptr() % 16 == 0, "kv_cache must be 16-byte aligned")
    need(q.data_ptr() % 16 == 0, "q must be 16-byte aligned")
    need(context_lens.dtype == torch.int32, f"context_lens must be int32, got {context_lens.dtype}")
    need(tuple(context_lens.shape) in ((B,), (B, next_n)),
         f"context_lens must have shape [{B}] or [{B}, {next_n}], got {tuple(context_lens.shape)}")
    need(block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == B
         and block_table.shape[1] >= 1,
         f"block_table must be int32 [{B}, max_blocks >= 1], got {block_table.dtype} {tuple(block_table.shape)}")
    need(isinstance(topk, int) and topk >= 1, f"topk must be a positive int, got {topk!r}")


_per_device: PerDevice[DsaIndexer] = PerDevice(DsaIndexer)


def dsa_indexer_topk(q, weights, kv_cache, context_lens, block_table, topk: int, **kw):
    """Functional form: uses one cached DsaIndexer per device. See the module docstring for conventions."""
    return _per_device.of(q.device)(q, weights, kv_cache, context_lens, block_table, topk, **kw)
