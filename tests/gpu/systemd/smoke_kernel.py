"""Run inside a transient unit with the rendered GPU sandbox: CUDA through the bound driver, and a Triton
kernel, which compiles its launcher with the rootfs's cc against the host's Python headers."""

import torch
import triton
import triton.language as tl


@triton.jit
def _add(x, y, out, n, block: tl.constexpr):
    i = tl.program_id(0) * block + tl.arange(0, block)
    mask = i < n
    tl.store(out + i, tl.load(x + i, mask=mask) + tl.load(y + i, mask=mask), mask=mask)


x = torch.randn(1000, device="cuda")
y = torch.randn_like(x)
out = torch.empty_like(x)
_add[(4,)](x, y, out, 1000, block=256)
torch.cuda.synchronize()
assert torch.allclose(out, x + y), "the Triton kernel computed a wrong sum"
print(f"smoke ok: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
