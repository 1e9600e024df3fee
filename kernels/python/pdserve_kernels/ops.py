"""The kernels as torch.library custom ops, for serving: ``torch.ops.pdserve.dsa_indexer_topk`` and
``torch.ops.pdserve.sparse_mla_decode`` (importing this module registers them; it needs torch >= 2.4).
Both are CUDA-only (no CPU kernel); their fake implementations serve FakeTensor / meta tracing.

What makes them fit for a serving loop (CUDA graphs, torch.compile, several streams):

* A plan made once per batch (``DsaIndexerPlan``, ``SparseMlaPlan``) from what the scheduler knows before
  the step: batch, next_n, heads, top-k and an upper bound on the lengths (host ints; no tensor is read).
  It loads the module, picks the kernel and computes the grids and split counts; every layer of the step
  then calls the op with it. Lengths stay on the device: the kernels read them there, so the same plan and
  the same captured graph serve any lengths up to the bound.
* The op only checks shapes (host metadata) and launches on the current stream: no host sync, no
  allocation but its outputs, no lock. The scratch it needs is a static buffer the caller owns
  (``DsaWorkspace``, ``MlaWorkspace``): allocate one per stream before capture; two streams must not share
  one (the indexer's histograms and the fused sparse MLA plans' counters are zero-kept state). The ops
  declare them mutated, so torch.compile orders them.
* Fake (meta) implementations give the outputs' shapes and dtypes, so FakeTensor tracing and torch.compile
  work without running a kernel.

The kernels' conventions are those of the launchers (dsa_indexer.py, sparse_mla_decode.py): the layouts
SGLang's DSA backend passes (q fp8 [B, 1, 64, 128], index cache [pages, 64, 1, 132], context_lens [B] or
[B, 1]; MLA q [B, 1, h, 576] or [B, h, 576], fp8 cache [pages, 64, 1, 656], bf16 cache [slots, 1, 576],
indices [B, 1, topk] physical slots with -1 padding) are taken as they are, as views, without copies.
The indexer returns positions within the request (DeepGEMM's logits + top-k), not SGLang's physical slots.
"""

from __future__ import annotations

import math

import torch

from ._launcher import PerDevice
from .dsa_indexer import (
    PAGE,
    SCRATCH_INTS_PER_POSITION,
    SELECT_CHUNK,
    STATE_INTS_PER_ROW,
    DsaIndexer,
    DsaPlan,
    _check_inputs,
    _round_up,
    plan_dsa,
)
from .sparse_mla_decode import (
    DV,
    MlaPlan,
    SparseMlaDecode,
    _cache_geometry,
    _check,
    _covers,
    fused_counters_per_block,
    fuses_by_default,
    kernel_shape,
)
from .sparse_mla_reference import LAYOUTS

NAMESPACE = "pdserve"

_indexers: PerDevice[DsaIndexer] = PerDevice(DsaIndexer)
_mlas: PerDevice[SparseMlaDecode] = PerDevice(SparseMlaDecode)


def _index(device) -> int:
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    return dev.index if dev.index is not None else torch.cuda.current_device()


def indexer_for(device=None) -> DsaIndexer:
    """The DsaIndexer of `device` (loaded on first use: not capture-safe; plans load it before any capture)."""
    return _indexers.of(torch.device("cuda", _index(device)))


def mla_for(device=None) -> SparseMlaDecode:
    """The SparseMlaDecode of `device` (loaded on first use, like indexer_for)."""
    return _mlas.of(torch.device("cuda", _index(device)))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_buffer(t, name: str, dtype, numel: int, device) -> None:
    _need(isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_contiguous() and t.device == device
          and t.numel() >= numel,
          f"{name} must be a contiguous {dtype} tensor of >= {numel} elements on {device}, got "
          + (f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__))


# ---- DSA indexer + exact top-k ----

# Registered with torch.library.Library (define + impl + register_fake) rather than torch.library.custom_op:
# the same dispatcher op, but custom_op's Python wrapper cost ~100 us more per call (measured on this CPU
# machine: 127 against 25 us per call of an empty op), which an eager decode step pays per layer.
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("dsa_indexer_topk(Tensor q, Tensor weights, Tensor kv_cache, Tensor context_lens, Tensor block_table, "
            "Tensor(a!) state, Tensor(b!) scratch, SymInt topk, SymInt max_len, SymInt chunk_pages, "
            "SymInt select_subs, bool early=False, bool cluster=False) -> Tensor")
_lib.define("sparse_mla_decode(Tensor q, Tensor kv, Tensor indices, Tensor? sinks, Tensor? extra_kv, "
            "Tensor? extra_indices, Tensor(a!) workspace, float sm_scale, str layout, str kernel, SymInt splits, "
            "SymInt per_split) -> (Tensor, Tensor)")


def _dsa_indexer_topk_cuda(q, weights, kv_cache, context_lens, block_table, state, scratch, topk: int, max_len: int,
                           chunk_pages: int, select_subs: int, early: bool = False, cluster: bool = False):
    """Top-`topk` positions per query row (int32 [B * next_n, topk]; see dsa_indexer.py for the conventions).
    max_len, chunk_pages, select_subs, early and cluster (the kernel variant) come from a DsaPlan; state / scratch
    from a DsaWorkspace."""
    ind = indexer_for(q.device)
    _check_inputs(torch, ind.device, q, weights, kv_cache, context_lens, block_table, topk)
    B, next_n = q.shape[0], q.shape[1]
    plan = plan_dsa(B, next_n, topk, max_len, ind.num_sms, max_blocks=block_table.shape[1],
                    chunk_pages=chunk_pages, select_subs=select_subs, early=bool(early), cluster=bool(cluster))
    _check_buffer(state, "state", torch.int32, plan.state_ints, ind.device)
    _check_buffer(scratch, "scratch", torch.int32, plan.scratch_ints, ind.device)
    out = torch.empty((plan.rows, topk), dtype=torch.int32, device=ind.device)
    ind.launch(plan, ind.default_impl, q, weights, kv_cache, context_lens, block_table, out=out,
               scores_ptr=scratch.data_ptr(), cand_ptr=scratch.data_ptr() + 4 * plan.rows * plan.len_stride,
               state=state)
    return out


def _dsa_indexer_topk_fake(q, weights, kv_cache, context_lens, block_table, state, scratch, topk, max_len,
                           chunk_pages, select_subs, early=False, cluster=False):
    torch._check(q.dim() == 4, lambda: f"q must be [B, next_n, 64, 128], got {tuple(q.shape)}")
    return q.new_empty((q.shape[0] * q.shape[1], topk), dtype=torch.int32)


_lib.impl("dsa_indexer_topk", _dsa_indexer_topk_cuda, "CUDA")
torch.library.register_fake(f"{NAMESPACE}::dsa_indexer_topk", _dsa_indexer_topk_fake, lib=_lib)
dsa_indexer_topk = torch.ops.pdserve.dsa_indexer_topk


class DsaWorkspace:
    """The indexer op's static buffers for one stream: `state` (histograms and counters of max_rows rows, kept
    zeroed by every call) and `scratch` (fp32 scores + candidates, 12 B per position of max_len rounded up to
    4096). Allocate before capture; give each stream its own."""

    def __init__(self, max_rows: int, max_len: int, device=None) -> None:
        dev = torch.device("cuda", _index(device))
        self.max_rows, self.max_len = max_rows, max(1, max_len)
        self.state = torch.zeros(max_rows * STATE_INTS_PER_ROW, dtype=torch.int32, device=dev)
        self.scratch = torch.empty(max_rows * _round_up(self.max_len, SELECT_CHUNK) * SCRATCH_INTS_PER_POSITION,
                                   dtype=torch.int32, device=dev)

    def fits(self, plan: DsaPlan) -> bool:
        return plan.state_ints <= self.state.numel() and plan.scratch_ints <= self.scratch.numel()


class DsaIndexerPlan:
    """One step's indexer launch, made once per batch and called for every layer (eager or under capture).

    `max_len` bounds every length the calls will see (the scheduler's longest request, or the captured
    context bound); `max_blocks` (the block table's width) clamps it. Without a `workspace` one is allocated
    for exactly this plan."""

    def __init__(self, batch: int, next_n: int, topk: int, max_len: int, *, device=None, max_blocks: int | None = None,
                 workspace: DsaWorkspace | None = None, chunk_pages: int | None = None,
                 early: bool | None = None, cluster: bool | None = None) -> None:
        self.indexer = indexer_for(device)
        self.plan = self.indexer.plan(batch, next_n, topk, max_len, max_blocks=max_blocks, chunk_pages=chunk_pages,
                                      early=early, cluster=cluster)
        if workspace is None:
            workspace = DsaWorkspace(self.plan.rows, self.plan.max_len, self.indexer.device)
        if not workspace.fits(self.plan):
            raise ValueError(f"the workspace (rows {workspace.max_rows}, max_len {workspace.max_len}) is too small "
                             f"for {self.plan.rows} rows of max_len {self.plan.max_len}")
        self.workspace = workspace

    def __call__(self, q, weights, kv_cache, context_lens, block_table) -> torch.Tensor:
        p = self.plan
        return torch.ops.pdserve.dsa_indexer_topk(q, weights, kv_cache, context_lens, block_table,
                                                  self.workspace.state, self.workspace.scratch, p.topk, p.max_len,
                                                  p.chunk_pages, p.select_subs, p.early, p.cluster)


# ---- sparse MLA decode (fp8 and bf16 KV) ----

def _mla_outputs_shape(q):
    """(out shape, lse shape): out follows q's rank ([B, h, 512] for [B, h, d_qk], else [B, next_n, h, 512])."""
    return (*q.shape[:-1], DV), tuple(q.shape[:-1])


def _sparse_mla_decode_cuda(q, kv, indices, sinks: torch.Tensor | None, extra_kv: torch.Tensor | None,
                            extra_indices: torch.Tensor | None, workspace, sm_scale: float, layout: str, kernel: str,
                            splits: int, per_split: int):
    """(out bf16 [..., h, 512], lse fp32 [..., h]) over the indexed entries (see sparse_mla_decode.py).
    layout, kernel, splits and per_split come from a MlaPlan; workspace from an MlaWorkspace."""
    mla = mla_for(q.device)
    _need(layout in LAYOUTS, f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    lay = LAYOUTS[layout]
    _need(q.dim() in (3, 4), f"q must be [B, h, d_qk] or [B, next_n, h, d_qk], got {tuple(q.shape)}")
    q4 = q.unsqueeze(1) if q.dim() == 3 else q
    ind3 = indices.unsqueeze(1) if indices.dim() == 2 else indices
    _check(torch, mla.device, lay, q4, ind3, kv, "kv", "indices")
    B, next_n, h, _ = q4.shape
    rows = B * next_n
    if extra_kv is not None or extra_indices is not None:
        _need(extra_kv is not None and extra_indices is not None, "extra_kv and extra_indices go together")
        e3 = extra_indices.unsqueeze(1) if extra_indices.dim() == 2 else extra_indices
        _check(torch, mla.device, lay, q4, e3, extra_kv, "extra_kv", "extra_indices")
        topk_extra = e3.shape[2]
    else:
        e3, extra_kv, topk_extra = ind3, kv, 0
    _need(sinks is None or (sinks.dtype == torch.float32 and tuple(sinks.shape) == (h,) and sinks.is_contiguous()
                            and sinks.device == mla.device),
          f"sinks must be a contiguous float32 tensor [{h}] on {mla.device}")
    _need(math.isfinite(sm_scale) and sm_scale > 0, f"sm_scale must be a positive finite float, got {sm_scale!r}")
    info = mla.kernels.kernels.get(kernel)
    _need(info is not None and info.family != "combine" and kernel_shape(info)[0] == layout,
          f"kernel {kernel!r} is not a {layout} kernel of {mla.kernels.path}")
    _, hb, tile = kernel_shape(info)
    ntot = ind3.shape[2] + topk_extra
    _need(splits >= 1 and per_split >= tile and per_split % tile == 0 and splits * per_split >= ntot
          and (splits - 1) * per_split < ntot and info.smem_bytes(per_split) <= mla.smem_limit,
          f"splits={splits}, per_split={per_split} do not cover {ntot} entries with {kernel} (make a new plan)")
    if layout == "v4" and 1 in (kv.shape[1], extra_kv.shape[1]) and info.family in ("ds", "wg"):
        _, stride, _ = _cache_geometry(torch, lay, kv, "kv")
        _, estride, _ = _cache_geometry(torch, lay, extra_kv, "extra_kv")
        _need(_covers(kv, stride, 592) and _covers(extra_kv, estride, 592),
              f"{kernel} reads 8 bytes past a page-1 V4 entry, beyond this cache's storage: plan with page=1")
    plan = MlaPlan(layout=layout, rows=rows, h=h, topk=ind3.shape[2], topk_extra=topk_extra, kernel=kernel,
                   splits=splits, per_split=per_split, heads_per_cta=hb, threads=info.threads,
                   smem=info.smem_bytes(per_split), fuse_combine=fuses_by_default(info, splits),
                   counters_per_block=fused_counters_per_block(info, splits))
    if splits > 1:
        _check_buffer(workspace, "workspace", torch.float32, plan.workspace_floats, mla.device)
    out_shape, lse_shape = _mla_outputs_shape(q)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=mla.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=mla.device)
    ws = workspace.data_ptr() if splits > 1 else None
    # A fused plan's counters: the workspace's last counter_ints slots (MlaWorkspace keeps them zero and out of
    # every plan's partials).
    counters = ws + 4 * (workspace.numel() - plan.counter_ints) if plan.fuse_combine else None
    mla.launch(plan, q4, kv, ind3, sm_scale, sinks=sinks, extra_kv=extra_kv, e3=e3, out=out, lse=lse, o_part_ptr=ws,
               lse_part_ptr=ws + 4 * rows * splits * h * DV if ws is not None else None, counters_ptr=counters)
    return out, lse


def _sparse_mla_decode_fake(q, kv, indices, sinks, extra_kv, extra_indices, workspace, sm_scale, layout, kernel,
                            splits, per_split):
    torch._check(q.dim() in (3, 4), lambda: f"q must be [B, h, d_qk] or [B, next_n, h, d_qk], got {tuple(q.shape)}")
    out_shape, lse_shape = _mla_outputs_shape(q)
    return q.new_empty(out_shape, dtype=torch.bfloat16), q.new_empty(lse_shape, dtype=torch.float32)


_lib.impl("sparse_mla_decode", _sparse_mla_decode_cuda, "CUDA")
torch.library.register_fake(f"{NAMESPACE}::sparse_mla_decode", _sparse_mla_decode_fake, lib=_lib)
sparse_mla_decode = torch.ops.pdserve.sparse_mla_decode


class MlaWorkspace:
    """The sparse MLA op's static split scratch for one stream: `partial_floats` fp32 slots for the split partials (a
    plan's partial_floats, or the largest of several), then `counter_ints` zeroed int32 counters at the end for
    fused plans (a plan's counter_ints, or the largest of several), which every fused call leaves at zero. So the
    plans that fit one workspace never write their partials over another's counters. Allocate before capture; give
    each stream its own."""

    def __init__(self, partial_floats: int, device=None, *, counter_ints: int = 0) -> None:
        self.partial_capacity, self.counter_capacity = partial_floats, counter_ints
        self.buffer = torch.zeros(max(1, partial_floats + counter_ints), dtype=torch.float32,
                                  device=torch.device("cuda", _index(device)))

    @classmethod
    def for_plan(cls, plan: MlaPlan, device=None) -> MlaWorkspace:
        return cls(plan.partial_floats, device, counter_ints=plan.counter_ints)

    def fits(self, plan: MlaPlan) -> bool:
        return plan.partial_floats <= self.partial_capacity and plan.counter_ints <= self.counter_capacity


class SparseMlaPlan:
    """One step's sparse MLA decode launch, made once per batch and called for every layer.

    `layout` is "v4" / "v32" with `bf16_kv` for a bf16 cache (or "v4_bf16" / "v32_bf16"; V4's bf16 kernels are in the
    tuning fatbin only, the production one refuses that layout: layout_refusal); `page` is the cache's
    page size (V4 with page 1 takes the first-version kernels). Exact on any fp32 scale by default (SGLang's
    amax/448 V3.2 tile scales included); `lossy_bf16_dequant=True` is the faster lossy opt-in (NOTES.md, "Exact by
    default"). The rest as SparseMlaDecode.make_plan. Without a `workspace` one is allocated for exactly this plan."""

    def __init__(self, layout: str, batch: int, next_n: int, h: int, topk: int, *, topk_extra: int = 0,
                 bf16_kv: bool = False, page: int = 64, device=None, workspace: MlaWorkspace | None = None,
                 **choice) -> None:
        if bf16_kv and not layout.endswith("_bf16"):
            layout += "_bf16"
        self.mla = mla_for(device)
        self.plan = self.mla.make_plan(layout, batch * next_n, h, topk, topk_extra, page=page, **choice)
        if workspace is None:
            workspace = MlaWorkspace.for_plan(self.plan, self.mla.device)
        if not workspace.fits(self.plan):
            raise ValueError(f"the workspace ({workspace.partial_capacity} floats of partials, "
                             f"{workspace.counter_capacity} counters) is too small for this plan "
                             f"({self.plan.partial_floats}, {self.plan.counter_ints})")
        self.workspace = workspace

    def __call__(self, q, kv, indices, sm_scale: float, *, sinks=None, extra_kv=None, extra_indices=None):
        p = self.plan
        return torch.ops.pdserve.sparse_mla_decode(q, kv, indices, sinks, extra_kv, extra_indices,
                                                   self.workspace.buffer, float(sm_scale), p.layout, p.kernel,
                                                   p.splits, p.per_split)


__all__ = [
    "PAGE",
    "DsaIndexerPlan",
    "DsaWorkspace",
    "MlaWorkspace",
    "SparseMlaPlan",
    "dsa_indexer_topk",
    "indexer_for",
    "mla_for",
    "sparse_mla_decode",
]
