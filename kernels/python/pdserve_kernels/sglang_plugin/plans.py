"""Launch plans and their workspaces, made on a shape's first call and kept.

SGLang calls the hooked functions with shapes fixed per batch size (and, in a CUDA graph, per captured
batch size), so a plan is keyed by (stream, shape) and reused by every layer and every later step. The
first call of a batch size is an eager warm-up in SGLang's graph runner, so plans and workspaces are
normally made outside any capture; one made during a capture is allocated from the graph's pool, which
stays valid as long as the plan holds it (it is never freed).

The indexer's plan also depends on a bound of the lengths, which eager decode steps (batches above the largest
captured size, or no CUDA graphs) raise by a token a step. So that bound is rounded up to a bucket (len_bucket: a
quarter of its power of two) and the op clamps it to each call's block table: a server whose contexts grow makes
four plans per doubling, not one per step. A bucket never passes the server's ceiling, the longest row its tables can
hold: SGLang captures its decode graphs with tables of exactly that width (its context length plus 4 spare tokens,
so 65540 tokens at a 64K context: 1025 pages of 64), and a plan for the next bucket up (81920) would run every
captured step with 25% more positions per scoring CTA than the rows can have (measured on one H100, 2026-12-07: the
V3.2 indexer and top-k of a batch of 8 took 17% longer so; tests/gpu/dsa/results/2026-12-07-h100x1-a2cfefc).

Workspaces are shared by all plans of one stream whose needs they cover: calls on one stream run one after
another, and the indexer's histograms are left zeroed by every call. A plan that needs more gets a new, larger
workspace. A workspace a CUDA graph was captured with stays alive for good (the graph points into it); one only
eager calls used is dropped, with its plans, when a larger one replaces it, so eager growth holds one workspace.
"""

from __future__ import annotations

from pdserve_kernels import ops
from pdserve_kernels.dsa_indexer import PAGE, SELECT_CHUNK


def _stream_key(device) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


def _capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


def plan_bound(exact: int, ceiling: int | None) -> int:
    """The length bound an indexer plan is made for: `exact`'s len_bucket, but not past `ceiling` (the server's
    longest row; None: unknown) unless `exact` itself is."""
    bucket = len_bucket(exact)
    return bucket if ceiling is None or exact > ceiling else min(bucket, ceiling)


def len_bucket(n: int) -> int:
    """`n` rounded up to a multiple of a quarter of its power of two, or of the indexer's 4096-position chunk where
    that is larger (its workspace rounds to a chunk anyway): four buckets per doubling, at most 25% over from 16K."""
    n = max(int(n), 1)
    step = max(SELECT_CHUNK, 1 << max(0, n.bit_length() - 3))
    return -(-n // step) * step


class PlanCache:
    def __init__(self) -> None:
        self._plans: dict[tuple, object] = {}
        self._dsa_workspaces: dict[tuple, list[ops.DsaWorkspace]] = {}
        self._mla_workspaces: dict[tuple, list[ops.MlaWorkspace]] = {}
        self._captured: set[int] = set()  # id() of the workspaces a CUDA graph was captured with
        self._refused: dict[tuple, str] = {}  # plan key -> why the launcher refused that shape

    def indexer(self, device, batch: int, topk: int, max_len: int, max_blocks: int,
                ceiling: int | None = None) -> ops.DsaIndexerPlan:
        """The plan for `batch` rows whose lengths are at most min(max_len, max_blocks * 64), made for that bound's
        len_bucket, capped at `ceiling`, the server's longest row (plan_bound; the op clamps it to each call's block
        table)."""
        stream = (device.index, _stream_key(device))
        bound = plan_bound(min(max_len, max_blocks * PAGE), ceiling)
        plan = self._cached(("dsa", *stream, batch, topk, bound),
                            lambda: self._new_indexer(device, stream, batch, topk, bound))
        if id(plan.workspace) not in self._captured and _capturing():  # asked once per workspace once captured
            self._captured.add(id(plan.workspace))
        return plan

    def _new_indexer(self, device, stream: tuple, batch: int, topk: int, bound: int) -> ops.DsaIndexerPlan:
        shape = ops.indexer_for(device).plan(batch, 1, topk, bound)
        pool = self._dsa_workspaces.setdefault(stream, [])
        workspace = next((w for w in pool if w.fits(shape)), None)
        if workspace is None:
            # Dropped first, so that the allocator can give their memory to the new one.
            self._drop_eager_workspaces(pool, shape.rows, shape.max_len)
            workspace = ops.DsaWorkspace(shape.rows, shape.max_len, device)
            pool.append(workspace)
        return ops.DsaIndexerPlan(batch, 1, topk, bound, device=device, workspace=workspace)

    def _cached(self, key: tuple, make):
        """The plan under `key`, made by `make()` on the key's first call. A shape the launcher refuses (ValueError,
        before anything is allocated) is refused again from the cache on every later call instead of being planned
        again: the hooks fall back per call, on every layer of every step."""
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        why = self._refused.get(key)
        if why is not None:
            raise ValueError(why)
        try:
            plan = make()
        except ValueError as e:
            self._refused[key] = str(e)
            raise
        self._plans[key] = plan
        return plan

    def _drop_eager_workspaces(self, pool: list, rows: int, max_len: int) -> None:
        """Drop from `pool` each workspace that a new one of `rows` x `max_len` covers and no graph was captured
        with, and the plans that hold it (they are made again, on the new one, at their next call)."""
        dropped = [w for w in pool if id(w) not in self._captured and w.max_rows <= rows and w.max_len <= max_len]
        if not dropped:
            return
        gone = {id(w) for w in dropped}
        pool[:] = [w for w in pool if id(w) not in gone]
        for key in [k for k, p in self._plans.items() if k[0] == "dsa" and id(p.workspace) in gone]:
            del self._plans[key]

    def mla(self, device, layout: str, batch: int, h: int, topk: int, *, bf16_kv: bool, page: int,
            lossy_bf16_dequant: bool = False, topk_extra: int = 0) -> ops.SparseMlaPlan:
        """The plan of one shape. The kernel is the launcher's choice (SparseMlaDecode.make_plan: one table for the
        plugin and every other caller), exact on SGLang's amax/448 scales unless the lossy opt-in is on. V4: `topk`
        window entries plus `topk_extra` compressed ones, `page` the smaller of the two sources' pages."""
        stream = (device.index, _stream_key(device))
        key = ("mla", *stream, layout, bf16_kv, batch, h, topk, topk_extra, page, lossy_bf16_dequant)

        def make() -> ops.SparseMlaPlan:
            name = layout + ("_bf16" if bf16_kv else "")
            shape = ops.mla_for(device).make_plan(name, batch, h, topk, topk_extra, page=page,
                                                  lossy_bf16_dequant=lossy_bf16_dequant)
            pool = self._mla_workspaces.setdefault(stream, [])
            workspace = next((w for w in pool if w.fits(shape)), None)
            if workspace is None:
                workspace = ops.MlaWorkspace.for_plan(shape, device)
                pool.append(workspace)
            return ops.SparseMlaPlan(layout, batch, 1, h, topk, topk_extra=topk_extra, bf16_kv=bf16_kv, page=page,
                                     device=device, workspace=workspace, lossy_bf16_dequant=lossy_bf16_dequant)
        return self._cached(key, make)

    def mla_kernels(self) -> set[str]:
        """The sparse MLA kernels this process's plans launch (each the launcher's choice for its shape)."""
        return {plan.plan.kernel for key, plan in self._plans.items() if key[0] == "mla"}

    def __len__(self) -> int:
        return len(self._plans)
