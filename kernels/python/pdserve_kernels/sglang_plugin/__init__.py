"""pdserve's DSA kernels inside SGLang, as an SGLang general plugin.

SGLang loads `load` through the `sglang.srt.plugins` entry point (kernels/python/pyproject.toml) in every
scheduler process, after it has set up logging and before it builds the model. The plugin is inert unless
the server's environment says ``PDSERVE_DSA_KERNELS=pdserve`` (pdserve's units set it from the deployment's
``attention_kernels``); then it wraps SGLang's DeepSeek V3.2 decode path (hooks.py) so that the indexer +
top-k and sparse MLA decode run pdserve's kernels, and SGLang's own kernel serves whatever shape or
configuration they do not support (logged once per reason); likewise DeepSeek V4's decode in SGLang's dsv4 backend
(v4_hooks.py: FlashMLA's sparse decode over the window and compressed caches, and the C4 indexer's logits + top-k).
Either way each DSA or dsv4 backend logs one status line saying which kernel serves each op (status.py), which
`pdserve verify` reads.

Sparse MLA decode is exact on SGLang's amax/448 V3.2 scales by default; ``PDSERVE_DSA_LOSSY_BF16_DEQUANT=1`` opts
into the faster lossy kernels (e4m3 x scale rounded to bf16; NOTES.md "Exact by default"), and the status line says so.

``PDSERVE_DSA_RECORD_DIR=<dir>`` (tests only) also runs SGLang's kernel beside each eager call and writes
the comparison there (record.py).
"""

from __future__ import annotations

import importlib.util
import operator
import os

from .status import PDSERVE, SGLANG, _ensure_handler, logger
from .v4_hooks import sglang_generation
from .v4_hooks import targets as v4_targets

ENV_SWITCH = "PDSERVE_DSA_KERNELS"
ENV_RECORD = "PDSERVE_DSA_RECORD_DIR"
ENV_LOSSY = "PDSERVE_DSA_LOSSY_BF16_DEQUANT"

_BACKEND = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend"
_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"
# V3.2 target -> the Runtime method wrapped around it (V4's: v4_hooks.targets, by the installed SGLang's layout)
TARGETS = {
    f"{_BACKEND}.__init__": "backend_init",
    f"{_BACKEND}.forward_decode": "forward_decode",
    f"{_INDEXER}._get_topk_paged": "indexer_topk",
    f"{_BACKEND}._forward_flashmla_kv": "mla_fp8",
    f"{_BACKEND}._forward_flashmla_sparse": "mla_bf16",
}
STATUS_ONLY = (f"{_BACKEND}.__init__",)  # what is wrapped when not requested (and V4's backend __init__)

_runtime = None


def requested() -> str:
    """pdserve's kernels only for exactly "pdserve"; any other value keeps SGLang's, and one that is neither
    "pdserve" nor "sglang" (a typo) says so in the log."""
    value = os.environ.get(ENV_SWITCH, SGLANG).strip()
    if value not in (PDSERVE, SGLANG, ""):
        _ensure_handler()
        logger.warning("pdserve-kernels: %s=%r is neither %r nor %r: SGLang's kernels serve (set it to %r for "
                       "pdserve's)", ENV_SWITCH, value, PDSERVE, SGLANG, PDSERVE)
    return PDSERVE if value == PDSERVE else SGLANG


def lossy_requested() -> bool:
    """Whether the environment opts into the lossy sparse MLA kernels: exactly "1"; "0" or unset keeps them off, and
    any other value keeps them off and says so in the log."""
    value = os.environ.get(ENV_LOSSY, "").strip()
    if value not in ("", "0", "1"):
        _ensure_handler()
        logger.warning("pdserve-kernels: %s=%r is neither '1' nor '0': the exact kernels serve (set it to '1' for "
                       "the lossy ones)", ENV_LOSSY, value)
    return value == "1"


def load(registry=None):
    """The entry point: register the hooks with SGLang's HookRegistry (SGLang applies them after every
    plugin has loaded). Returns the Runtime. `registry` is for tests."""
    global _runtime
    if _runtime is not None:  # SGLang guards against a second load; so does the plugin
        return _runtime
    if registry is None:
        from sglang.srt.plugins.hook_registry import HookRegistry as registry
    from sglang.srt.plugins.hook_registry import HookType

    from .hooks import Runtime

    want = requested()
    if want == PDSERVE:
        from pdserve_kernels import ops  # noqa: F401 - registers torch.ops.pdserve.* in this process

    runtime = Runtime(want, os.environ.get(ENV_RECORD) or None, lossy_bf16_dequant=lossy_requested())
    for target, method in all_targets(want).items():
        registry.register(target, operator.attrgetter(method)(runtime), HookType.AROUND)
    _runtime = runtime
    return runtime


def all_targets(want: str, generation: str | None = None) -> dict[str, str]:
    """Every target the plugin wraps for `want`, V3.2's and (for an SGLang with V4, by its layout: 0.5.17 or
    0.5.23, found from the installed one unless `generation` names it) V4's."""
    serving = want == PDSERVE
    found = dict(TARGETS) if serving else {t: TARGETS[t] for t in STATUS_ONLY}
    found.update(v4_targets(generation or sglang_generation(), serving=serving, deep_gemm=_has("deep_gemm")))
    return found


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
