"""DeepSpeed's activation checkpoint recomputes from an input changed in place, with no error.

Plain autograd raises when a tensor saved for backward was modified in place after the forward.
deepspeed.checkpointing.checkpoint (reentrant, DeepSpeed 0.17.6) keeps the segment's inputs on the
autograd context as plain attributes instead of ctx.save_for_backward, so no version counter guards
them: the recompute silently uses the new value, and the gradient is that of a forward that never ran.
Run: DS_ACCELERATOR=cpu .venv/bin/python docs/deepspeed_inplace_input.py (after ci/setup.sh --frameworks).
On CPU DeepSpeed's accelerator has no Stream; the two lines marked "CPU only" give it one that returns
no stream (what its stream() context expects), as ckverify.adapters.deepspeed(cpu_streams=true) does.
"""
import tempfile

import torch
import deepspeed
from deepspeed.accelerator import get_accelerator

accelerator = get_accelerator()
if accelerator.device_name() == "cpu" and accelerator.Stream is None:  # CPU only
    type(accelerator).Stream = property(lambda self: (lambda *a, **k: None))  # CPU only
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                           init_method="file://%s/store" % tempfile.mkdtemp(), rank=0, world_size=1)
deepspeed.checkpointing.configure(None)

torch.manual_seed(0)
w = torch.randn(4, requires_grad=True)
segment = lambda t: (t * w).sin()

# Plain autograd: the in-place change is caught.
x = torch.randn(4, requires_grad=True) * 1.0
y = segment(x)
x.add_(1.0)
try:
    y.sum().backward()
    print("plain autograd: no error (unexpected)")
except RuntimeError as e:
    print("plain autograd raises:", str(e).split("\n")[0][:90])

# DeepSpeed's checkpoint: no error, and the gradient of the changed input.
w.grad = None
x = torch.randn(4, requires_grad=True) * 1.0
x_seen = x.clone()
y = deepspeed.checkpointing.checkpoint(segment, x)
x.add_(1.0)
y.sum().backward()
print("deepspeed checkpoint: no error; w.grad matches the forward that ran:",
      torch.allclose(w.grad, (x_seen * w).cos() * x_seen),
      "| matches the changed input:", torch.allclose(w.grad, (x * w).cos() * x))
