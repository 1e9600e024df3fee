#!/usr/bin/env python3
"""Tuning table (not THE benchmark): the wg kernels (sm_90a, wgmma, 64 heads per CTA) against the launcher's
current default ("auto": ds or first-version kernels) for fp8 KV at h >= 64, timed round-robin in one process
on the same inputs (same Timer as bench_sparse_mla.py: CUDA events, L2 evicted before every repeat, median),
each checked against the fp32 reference on its first rows. With --splits, the wg kernel is also timed at
each listed split count. NOTES.md records what it showed; the default is chosen from it.
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
from pdserve_kernels.sparse_mla_decode import WG_KERNELS, SparseMlaDecode, wg_kernel_name  # noqa: E402
from pdserve_kernels.sparse_mla_reference import LAYOUTS, reference_decode  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batches", default="1,8,64,128")
    ap.add_argument("--heads", default="64,128")
    ap.add_argument("--cases", default="v4-csa,v4-hca,v32")
    ap.add_argument("--splits", default="", help="comma-separated split counts to time the wg kernel at")
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
    split_list = [int(x) for x in args.splits.split(",") if x]
    rows_out, pools = [], {}
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
                auto = mla.pick_kernel(layout, h, variant="auto", rows=B)
                wg = wg_kernel_name(layout)
                cands = [("auto", auto, None), ("wg", wg, None)] + [(f"wg {s} splits", wg, s) for s in split_list]
                # every other (non-probe) wg kernel of the layout, by its suffix
                cands += [("wg" + (n[len(f"sparse_mla_wg_{layout}_s3"):] or "_plain"), n, None)
                          for n, (lay, _nst, probe) in sorted(WG_KERNELS.items())
                          if lay == layout and not probe and n != wg]
                fns, labels, info = [], [], {}
                for label, name, s in cands:
                    call = (lambda name=name, s=s: mla(q, kv, ind, sm_scale, layout=layout, sinks=sinks, kernel=name,
                                                       splits=s, **extra))
                    out, _ = call()
                    err = ((out[:r].view(r, h, 512).float() - ro).norm() / ro.norm()).item()
                    info[label] = {"kernel": name, "splits": mla.plan(name, B, h, k_main + k_win, s)[0], "rel_err": err}
                    fns.append(call)
                    labels.append(label)
                ts = timer.medians_us(fns, args.reps)
                row = {"case": case, "B": B, "h": h, "us": dict(zip(labels, (round(x, 2) for x in ts))), "info": info}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"# {env['date']} | {env['gpu']} | driver {env['driver']} | torch {env['torch']}")
    print(f"# command: {env['command']}")
    print("| case | B | h | auto kernel (splits) | auto us | wg kernel | wg us (splits) | auto / wg | "
          "other wg kernels / splits us | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows_out:
        us, info = row["us"], row["info"]
        other = ", ".join(f"{k}: {v:.1f}" for k, v in us.items() if k not in ("auto", "wg"))
        cells = [row["case"], str(row["B"]), str(row["h"]),
                 f"{info['auto']['kernel'].replace('sparse_mla_', '')} ({info['auto']['splits']})",
                 f"{us['auto']:.1f}", info["wg"]["kernel"].replace("sparse_mla_", ""),
                 f"{us['wg']:.1f} ({info['wg']['splits']})", f"{us['auto'] / us['wg']:.2f}", other, f"{max(v['rel_err'] for v in info.values()):.1e}"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
