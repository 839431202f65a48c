# docs/torch_reentrant_autocast_cache.py: plain PyTorch, no ckverify. The check behind the finding in
# docs/findings.md on torch.utils.checkpoint(use_reentrant=True) under bf16 autocast: two post-norm blocks, trained
# one step without checkpointing, with use_reentrant=True and with use_reentrant=False; gradients compared
# bitwise. Run it twice: as is (autocast's cast cache on: reentrant differs, non-reentrant does not), and
# with cache_enabled=False in the torch.autocast call (both equal): the difference is autocast caching the
# bf16 cast of the detached leaf inputs the reentrant recompute runs on.
#   .venv/bin/python docs/torch_reentrant_autocast_cache.py
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
d = 4
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.k, s.v, s.o = (nn.Linear(d, d) for _ in range(4))
        s.n1 = nn.LayerNorm(d); s.f1 = nn.Linear(d, d); s.f2 = nn.Linear(d, d); s.n2 = nn.LayerNorm(d)
    def forward(s, x):  # post-norm block
        q, k, v = s.q(x), s.k(x), s.v(x)
        a = torch.softmax(q @ k.transpose(-1, -2) / 2, -1) @ v
        x = s.n1(x + s.o(a))
        return s.n2(x + s.f2(torch.relu(s.f1(x))))
blocks = nn.ModuleList([Block(), Block()])
x0 = torch.randn(2, 8, d)
def run(mode):
    for p in blocks.parameters(): p.grad = None
    x = x0.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        h = x
        for b in blocks:
            h = b(h) if mode is None else checkpoint(b, h, use_reentrant=mode)
        loss = h.float().square().sum()
    loss.backward()
    r = {n: p.grad.clone() for n, p in blocks.named_parameters()}
    r['x'] = x.grad.clone()
    return r
g0, gr, gn = run(None), run(True), run(False)
worst = lambda g: max(((g[n] - g0[n]).abs().max().item() / (g0[n].abs().max().item() + 1e-30), n) for n in g0)
print("reentrant vs plain, worst relative:", worst(gr))
print("non-reentrant vs plain, worst relative:", worst(gn))
scale = max(g.abs().max().item() for g in g0.values())
for name, g in (("reentrant", gr), ("non-reentrant", gn)):
    diffs = sorted(((g[n] - g0[n]).abs().max().item() / scale, n) for n in g0)[-3:]
    print(name, "largest differences / largest gradient:", [(n, f"{v:.2e}") for v, n in diffs])
