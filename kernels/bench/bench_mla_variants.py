#!/usr/bin/env python3
"""Tuning table (not THE benchmark): fp8 sparse MLA decode, the first-version kernels against every "ds"
kernel that fits the head count, timed round-robin in one process on the same inputs, plus the ds default
(variant "ds") with the fused split-combine and, at B = 64, at 1-4 splits. Each candidate is also checked
against the fp32 reference (first rows). The launcher's default ("auto") is chosen from this table.

Timing as bench_sparse_mla.py (CUDA events, L2 evicted before every repeat, median). One table per run;
NOTES.md records what it showed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from bench_dsa_indexer import Timer, sh  # noqa: E402
from bench_sparse_mla import CASES, PAGE, distinct_indices, random_pool  # noqa: E402
from pdserve_kernels.sparse_mla_decode import DS_KERNELS, SparseMlaDecode  # noqa: E402
from pdserve_kernels.sparse_mla_reference import LAYOUTS, reference_decode  # noqa: E402


def candidates(mla, layout: str, h: int) -> list[tuple[str, str]]:
    """(label, kernel name) pairs: the first-version default, then the ds kernels for this head count."""
    out = [("old", mla.pick_kernel(layout, h, variant=""))]
    for name, (lay, hb, _T, _nst, _cv) in DS_KERNELS.items():
        if lay != layout:
            continue
        if (h <= 16 and hb == 16) or (h > 16 and hb == 32):
            out.append((name.replace("sparse_mla_ds_", "ds_"), name))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--batches", default="1,8,64,128")
    ap.add_argument("--heads", default="16,32,64,128")
    ap.add_argument("--cases", default="v4-csa,v4-hca,v32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(datetime.datetime.now().timestamp()))
    timer = Timer(head_start_cycles=200_000)
    mla = SparseMlaDecode()
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "gpu": torch.cuda.get_device_name(0),
           "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
           "torch": torch.__version__, "command": " ".join(sys.argv)}
    print(json.dumps(env), flush=True)
    rows_out = []
    pools = {}
    for case in args.cases.split(","):
        layout, k_main, k_win = CASES[case]
        lay = LAYOUTS[layout]
        if layout not in pools:
            pools[layout] = random_pool(lay, 1 << 20, gen)
        buf, kv = pools[layout]
        win_buf = win = None
        if k_win:
            if "win-" + layout not in pools:
                pools["win-" + layout] = random_pool(lay, 1 << 17, gen)
            win_buf, win = pools["win-" + layout]
        sm_scale = lay.dqk ** -0.5
        for B in [int(x) for x in args.batches.split(",")]:
            ind = distinct_indices(B, k_main, kv.shape[0] * PAGE, gen).view(B, 1, k_main)
            wind = distinct_indices(B, k_win, win.shape[0] * PAGE, gen).view(B, 1, k_win) if k_win else None
            extra = dict(extra_kv=win, extra_indices=wind) if k_win else {}
            for h in [int(x) for x in args.heads.split(",")]:
                q = torch.randn((B, 1, h, lay.dqk), device="cuda", generator=gen).to(torch.bfloat16)
                sinks = torch.randn((h,), device="cuda", generator=gen)
                r = min(B, 2)
                ro, _ = reference_decode(lay, q[:r].view(r, h, lay.dqk), buf, PAGE, ind[:r].view(r, -1), sm_scale,
                                         sinks, extra_cache=win_buf, extra_page=PAGE,
                                         extra_indices=wind[:r].view(r, -1) if k_win else None)
                cands = candidates(mla, layout, h)
                fns, labels, info = [], [], {}
                for label, name in cands:
                    splits, _ = mla.plan(name, B, h, k_main + k_win)
                    out, _ = mla(q, kv, ind, sm_scale, layout=layout, sinks=sinks, kernel=name, **extra)
                    o = out[:r].view(r, h, 512).float()
                    err = ((o - ro).norm() / ro.norm()).item()
                    info[label] = {"splits": splits, "rel_err": err}
                    fns.append(lambda name=name: mla(q, kv, ind, sm_scale, layout=layout, sinks=sinks, kernel=name,
                                                     **extra))
                    labels.append(label)
                ds = mla.pick_kernel(layout, h, variant="ds", rows=B)
                labels.append("ds default fused")
                fns.append(lambda: mla(q, kv, ind, sm_scale, layout=layout, sinks=sinks, kernel=ds, fuse_combine=True,
                                       **extra))
                out, _ = fns[-1]()
                info["ds default fused"] = {"splits": mla.plan(ds, B, h, k_main + k_win)[0],
                                            "rel_err": ((out[:r].view(r, h, 512).float() - ro).norm() / ro.norm()).item()}
                if B == 64:
                    for s in (1, 2, 3, 4):
                        labels.append(f"ds default, {s} splits")
                        fns.append(lambda s=s: mla(q, kv, ind, sm_scale, layout=layout, sinks=sinks, kernel=ds,
                                                   splits=s, **extra))
                ts = timer.medians_us(fns, args.reps)
                row = {"case": case, "B": B, "h": h, "us": dict(zip(labels, (round(x, 2) for x in ts))),
                       "info": info, "ds_default": ds.replace("sparse_mla_ds_", "ds_"),
                       "auto_default": mla.pick_kernel(layout, h, rows=B)}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"# {env['date']} | {env['gpu']} | driver {env['driver']} | torch {env['torch']}")
    print(f"# command: {env['command']}")
    print("| case | B | h | old us (splits) | ds default us (splits) | ds default, fused combine us | best ds us | "
          "every ds kernel us | ds default at 1/2/3/4 splits (B=64) | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows_out:
        us, info = row["us"], row["info"]
        dsl = {k: v for k, v in us.items() if k.startswith("ds_")}
        best = min(dsl, key=dsl.get)
        want = row["ds_default"]
        sweep = " / ".join(f"{us[f'ds default, {s} splits']:.1f}" for s in (1, 2, 3, 4)) if row["B"] == 64 else ""
        cells = [row["case"], str(row["B"]), str(row["h"]), f"{us['old']:.1f} ({info['old']['splits']})",
                 f"{us[want]:.1f} ({info[want]['splits']})", f"{us['ds default fused']:.1f}",
                 f"{best.replace('ds_', '')} {dsl[best]:.1f}",
                 ", ".join(f"{k.replace('ds_', '')} {v:.1f}" for k, v in dsl.items()), sweep,
                 f"{max(v['rel_err'] for v in info.values()):.1e}"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
