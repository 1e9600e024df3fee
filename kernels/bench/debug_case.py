#!/usr/bin/env python3
"""Debug aid: run one next_n=2 case with a given impl/pdl/select setting; exit 0 when results check out."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import torch  # noqa: E402

from pdserve_kernels.dsa_indexer import DsaIndexer  # noqa: E402
from pdserve_kernels.reference import make_inputs  # noqa: E402

impl, pdl, select, next_n = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", int(sys.argv[4])
lens = [int(x) for x in sys.argv[5].split(",")]
ind = DsaIndexer()
inp = make_inputs(len(lens), next_n, lens)
out = ind(**inp, topk=512, impl=impl, pdl=pdl, _select=select, max_len=max(lens))
torch.cuda.synchronize()
print("ok", impl, pdl, select, next_n, lens, out[:, :4].tolist()[:4])
