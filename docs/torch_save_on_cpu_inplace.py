# docs/torch_save_on_cpu_inplace.py: what ckverify's refuses-inplace found on torch.autograd.graph.save_on_cpu,
# in plain PyTorch (no ckverify). On CPU tensors with pin_memory=False, save_on_cpu's pack hook keeps
# tensor.cpu(), which for a CPU tensor is the tensor itself, not a copy; and a saved tensor that goes
# through pack/unpack hooks has no version-counter check. So a tensor modified in place between forward
# and backward is used with its new value, silently, where plain autograd raises. Run:
#   .venv/bin/python docs/torch_save_on_cpu_inplace.py
import torch

torch.manual_seed(0)
x = torch.randn(4, requires_grad=True)


def grad_of(hooks, edit):
    a = x * 1.0
    if hooks:
        with torch.autograd.graph.save_on_cpu(pin_memory=False):
            b = a.sin()  # saves a for backward (d sin(a) = cos(a))
    else:
        b = a.sin()
    if edit:
        with torch.no_grad():
            a.add_(1.0)
    try:
        b.sum().backward()
    except RuntimeError as e:
        return "raises: " + str(e).split("\n")[0][:80]
    g, x.grad = x.grad.clone(), None
    return g


print("plain autograd, no in-place change :", grad_of(False, False))
print("plain autograd, a.add_(1) before bw:", grad_of(False, True))
print("save_on_cpu,    a.add_(1) before bw:", grad_of(True, True))
print("cos(x + 1), the gradient at the new value:", torch.cos(x.detach() + 1.0))
