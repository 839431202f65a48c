"""Checkpointing strategies in seed 001's lab convention, gated with `ckverify check --strategy`.

Written for ckverify from the seed's description (experiments 1-4 of the memory/compute lab): each takes
the block stack as an nn.ModuleList and the input, decides which blocks to checkpoint, and returns the
output. ckverify calls them as FUNC(blocks, x, **options), so the options are the functions' own
parameters (`--strategy py:lab:run_with_selective_checkpointing:checkpoint_every_n=2`).

  run_with_checkpointing           every block its own checkpoint
  run_with_selective_checkpointing block i checkpointed when i % checkpoint_every_n == 0
  run_with_segment_checkpointing   num_segments contiguous segments, each one checkpoint
  run_with_hybrid_checkpointing    blocks before checkpoint_start_layer plain, the rest checkpointed
  run_with_checkpoint_sequential   torch.utils.checkpoint.checkpoint_sequential over the stack
  run_with_segment_checkpointing_floor_bug
                                   a realistic mistake: segment sizes from L // num_segments, so when
                                   num_segments does not divide L the last L % num_segments blocks
                                   are never run (ckverify names the first one skipped)
"""
import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


def _run(blocks):
    def run(x):
        for block in blocks:
            x = block(x)
        return x

    return run


def run_with_checkpointing(blocks, x):
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


def run_with_selective_checkpointing(blocks, x, checkpoint_every_n=2):
    for i, block in enumerate(blocks):
        x = checkpoint(block, x, use_reentrant=False) if i % checkpoint_every_n == 0 else block(x)
    return x


def _bounds(n, k):
    k = max(1, min(k, n))
    size, extra = divmod(n, k)
    start = 0
    for s in range(k):
        stop = start + size + (1 if s < extra else 0)
        yield start, stop
        start = stop


def run_with_segment_checkpointing(blocks, x, num_segments=2):
    for start, stop in _bounds(len(blocks), num_segments):
        x = checkpoint(_run(blocks[start:stop]), x, use_reentrant=False)
    return x


def run_with_hybrid_checkpointing(blocks, x, checkpoint_start_layer=1):
    for i, block in enumerate(blocks):
        x = checkpoint(block, x, use_reentrant=False) if i >= checkpoint_start_layer else block(x)
    return x


def run_with_checkpoint_sequential(blocks, x, segments=2):
    return checkpoint_sequential(blocks, min(segments, len(blocks)), x, use_reentrant=False)


def run_with_segment_checkpointing_floor_bug(blocks, x, num_segments=2):
    size = max(1, len(blocks) // num_segments)
    for s in range(min(num_segments, len(blocks))):
        x = checkpoint(_run(blocks[s * size:(s + 1) * size]), x, use_reentrant=False)
    return x
