# docs/torch_sac_unsafe_view_mutation.py: what ckverify found on torch's selective activation checkpointing
# (SAC, torch.utils.checkpoint.create_selective_checkpoint_contexts), in plain PyTorch (no ckverify).
#
# LibTorch's C++ torch::nn::Linear (torch/nn/functional/linear.h) computes a non-2-D input as
# input.matmul(weight.t()) followed by `output += bias`. matmul folds 3-D @ 2-D into aten.mm and returns
# aten._unsafe_view(mm_out): an alias sharing mm_out's storage but not its version counter. A SAC policy
# that saves aten.mm caches mm_out at version 0; the in-place bias add bumps only the alias's counter, so
# SAC's check against mutated cache entries (allow_cache_entry_mutation=False, the default) does not fire,
# and the recompute returns the already-biased buffer, to which the bias is added again: the recomputed
# activation is x W^T + 2b and the gradients are silently wrong. Run:
#   .venv/bin/python docs/torch_sac_unsafe_view_mutation.py
import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

torch.manual_seed(0)
W = torch.randn(4, 4, requires_grad=True)
b = torch.randn(4, requires_grad=True)
save_mm = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.mm.default])


def gradients(f, x, selective):
    x = x.detach().requires_grad_()
    y = checkpoint(f, x, use_reentrant=False, context_fn=save_mm) if selective else f(x)
    return torch.autograd.grad(y.sum(), (x, W, b))


def compare(what, f, x):
    try:
        same = all(torch.allclose(p, q) for p, q in zip(gradients(f, x, False), gradients(f, x, True)))
        print(f"{what}: {'equal to the plain run' if same else 'DIFFERENT from the plain run, no error'}")
    except RuntimeError as e:
        print(f"{what}: raises: {str(e).splitlines()[0]}")


x3 = torch.randn(2, 3, 4)
compare("3-D matmul, then bias added in place (C++ nn::Linear)", lambda x: torch.matmul(x, W.t()).add_(b).square(), x3)
compare("2-D mm, then bias added in place (no alias)", lambda x: torch.mm(x, W.t()).add_(b).square(), x3[0])
compare("F.linear on a contiguous 3-D input (addmm)", lambda x: F.linear(x, W, b).square(), x3)
M = torch.randn(6, 4)
alias = torch.ops.aten._unsafe_view(M, [2, 3, 4])
alias.add_(1)
print(f"after alias.add_(1): alias._version={alias._version}, base._version={M._version}")
gx = gradients(lambda x: torch.matmul(x, W.t()).add_(b).square(), x3, True)[0]
with torch.no_grad():
    print("SAC's x.grad equals the gradient of (x W^T + 2b)^2:", torch.allclose(gx, (2 * (x3 @ W.t() + 2 * b)) @ W))
