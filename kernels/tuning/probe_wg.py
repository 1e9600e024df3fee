"""Tuning aid for the wg kernels (not a test). Default: runs every wg kernel on small V4 and V3.2 inputs and
prints its relative error against the fp32 reference (how the MN-major V descriptor convention was settled:
NOTES.md "wg kernels"; the _x probes print ~1.0 by design). `--time`: median us of every V3.2 wg kernel,
probes included (no conversion / no wgmma / neither; for the experimental wgt kernels also no entry loads),
at four shapes: which side bounds a tile. `--pool N`: a KV pool of N entries (default 2^20, 688 MB; e.g. 16384,
11 MB, to see what the gathers' TLB misses cost).
The probes exist only in the tuning build: run `bash kernels/tuning/build.sh` first (it writes
kernels/build/sparse_mla_decode_tuning.{fatbin,json}), then `python3 kernels/tuning/probe_wg.py [--time]` from
the repo root on an sm_90a GPU."""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parent / "bench"))

import torch  # noqa: E402

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode  # noqa: E402
from pdserve_kernels.sparse_mla_reference import LAYOUTS, make_inputs, reference_from_inputs  # noqa: E402

TUNING_FATBIN = HERE.parent / "build" / "sparse_mla_decode_tuning.fatbin"


def load() -> SparseMlaDecode:
    if not TUNING_FATBIN.is_file():
        sys.exit(f"{TUNING_FATBIN} not found: build it with `bash kernels/tuning/build.sh`")
    return SparseMlaDecode(fatbin=TUNING_FATBIN)


def main() -> None:
    mla = load()
    g = torch.Generator(device="cuda")
    g.manual_seed(time.time_ns() % (1 << 31))
    for name, info in sorted(mla.kernels.family("wg").items()):
        layout = info.shape["layout"]
        for h, topk, extra in ((64, 512, 128 if layout == "v4" else 0), (128, 100, 0)):
            if -(-h // 64) % info.shape.get("cluster_head_blocks", 1):
                continue
            inp = make_inputs(layout, 2, 1, h, topk, topk_extra=extra, generator=g)
            sm = LAYOUTS[layout].dqk ** -0.5
            kw = {"extra_kv": inp["extra_kv"], "extra_indices": inp["extra_indices"]} if extra else {}
            try:
                out, lse = mla(inp["q"], inp["kv"], inp["indices"], sm, layout=layout, sinks=inp["sinks"],
                               kernel=name, lossy_bf16_dequant=True, **kw)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                print(f"{name} h={h}: {type(e).__name__}: {e}")
                continue
            ro, rl = reference_from_inputs(inp, sm)
            rel = ((out.float() - ro).norm() / ro.norm()).item()
            dl = (lse - rl).abs().max().item()
            print(f"{name} h={h} topk={topk}+{extra}: rel err {rel:.3e}, max |dlse| {dl:.3e}, "
                  f"nan {torch.isnan(out.float()).any().item()}")


if __name__ == "__main__" and "--time" not in sys.argv:
    main()


def time_probes() -> None:
    """Median us of each wg kernel (probes included: their results are wrong by design) on V3.2 top-2048."""
    from harness import PAGE, Timer, distinct_indices, random_pool

    mla = load()
    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    lay = LAYOUTS["v32"]
    n_pool = int(sys.argv[sys.argv.index("--pool") + 1]) if "--pool" in sys.argv else 1 << 20
    _, kv = random_pool(lay, n_pool, g)
    print(f"V3.2 pool of {kv.shape[0] * PAGE} entries")
    timer = Timer(head_start_cycles=200_000)
    names = sorted(n for n, k in mla.kernels.family("wg").items() if k.shape["layout"] == "v32")
    print("| B | h | " + " | ".join(names) + " |")
    for B, h in ((64, 128), (128, 64), (8, 128), (1, 128)):
        ind = distinct_indices(B, 2048, kv.shape[0] * PAGE, g).view(B, 1, 2048)
        q = torch.randn((B, 1, h, 576), device="cuda", generator=g).to(torch.bfloat16)
        ok = [n for n in names if -(-h // 64) % mla.kernels[n].shape.get("cluster_head_blocks", 1) == 0]
        fns = [lambda n=n: mla(q, kv, ind, 576 ** -0.5, layout="v32", kernel=n, lossy_bf16_dequant=True) for n in ok]
        ts = dict(zip(ok, timer.medians_us(fns, 20), strict=False))
        print(f"| {B} | {h} | " + " | ".join(f"{ts[n]:.1f}" if n in ts else "" for n in names) + " |", flush=True)


if __name__ == "__main__" and "--time" in sys.argv:
    time_probes()
