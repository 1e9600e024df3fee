"""Launch plans and their workspaces, made on a shape's first call and kept.

SGLang calls the hooked functions with shapes fixed per batch size (and, in a CUDA graph, per captured
batch size), so a plan is keyed by (stream, shape) and reused by every layer and every later step. The
first call of a batch size is an eager warm-up in SGLang's graph runner, so plans and workspaces are
normally made outside any capture; one made during a capture is allocated from the graph's pool, which
stays valid as long as the plan holds it (it is never freed).

Workspaces are shared by all plans of one stream whose needs they cover: calls on one stream run one after
another, and the indexer's histograms are left zeroed by every call. A plan that needs more gets a new,
larger workspace; the older ones stay alive because graphs captured earlier point into them.
"""

from __future__ import annotations

from pdserve_kernels import ops


def _stream_key(device) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


class PlanCache:
    def __init__(self) -> None:
        self._plans: dict[tuple, object] = {}
        self._dsa_workspaces: dict[int, list[ops.DsaWorkspace]] = {}
        self._mla_workspaces: dict[int, list[ops.MlaWorkspace]] = {}

    def indexer(self, device, batch: int, topk: int, max_len: int, max_blocks: int) -> ops.DsaIndexerPlan:
        stream = _stream_key(device)
        key = ("dsa", device.index, stream, batch, topk, max_len, max_blocks)
        plan = self._plans.get(key)
        if plan is None:
            shape = ops.indexer_for(device).plan(batch, 1, topk, max_len, max_blocks=max_blocks)
            pool = self._dsa_workspaces.setdefault(stream, [])
            workspace = next((w for w in pool if w.fits(shape)), None)
            if workspace is None:
                workspace = ops.DsaWorkspace(shape.rows, shape.max_len, device)
                pool.append(workspace)
            plan = ops.DsaIndexerPlan(batch, 1, topk, max_len, device=device, max_blocks=max_blocks,
                                      workspace=workspace)
            self._plans[key] = plan
        return plan

    def mla(self, device, layout: str, batch: int, h: int, topk: int, *, bf16_kv: bool, page: int,
            lossy_bf16_dequant: bool = False, topk_extra: int = 0) -> ops.SparseMlaPlan:
        """The plan of one shape. The kernel is the launcher's choice (SparseMlaDecode.make_plan: one table for the
        plugin and every other caller), exact on SGLang's amax/448 scales unless the lossy opt-in is on. V4: `topk`
        window entries plus `topk_extra` compressed ones, `page` the smaller of the two sources' pages."""
        stream = _stream_key(device)
        key = ("mla", device.index, stream, layout, bf16_kv, batch, h, topk, topk_extra, page, lossy_bf16_dequant)
        plan = self._plans.get(key)
        if plan is None:
            name = layout + ("_bf16" if bf16_kv else "")
            shape = ops.mla_for(device).make_plan(name, batch, h, topk, topk_extra, page=page,
                                                  lossy_bf16_dequant=lossy_bf16_dequant)
            pool = self._mla_workspaces.setdefault(stream, [])
            workspace = next((w for w in pool if w.fits(shape)), None)
            if workspace is None:
                workspace = ops.MlaWorkspace.for_plan(shape, device)
                pool.append(workspace)
            plan = ops.SparseMlaPlan(layout, batch, 1, h, topk, topk_extra=topk_extra, bf16_kv=bf16_kv, page=page,
                                     device=device, workspace=workspace, lossy_bf16_dequant=lossy_bf16_dequant)
            self._plans[key] = plan
        return plan

    def mla_kernels(self) -> set[str]:
        """The sparse MLA kernels this process's plans launch (each the launcher's choice for its shape)."""
        return {plan.plan.kernel for key, plan in self._plans.items() if key[0] == "mla"}

    def __len__(self) -> int:
        return len(self._plans)
