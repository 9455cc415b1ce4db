"""SGLang's MoE routing prologue in plain PyTorch, for `segfuse capture` (docs/torch.md, "Capture a
PyTorch function"):

    segfuse capture examples/moe_prologue_torch.py:moe_prologue --example topk_ids=16x4xint64 \\
        --dynamic topk_ids=0:T -o moe_prologue_captured.json

Tokens per expert (a scatter-add histogram), the experts' offsets (an exclusive prefix sum), and the
two permutations of the flattened top-k ids: sorted by expert, and back.
"""

import torch

E, K = 64, 4  # experts, experts per token


def moe_prologue(topk_ids):
    flat = topk_ids.flatten()
    counts = torch.zeros(E, dtype=torch.int64).scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    order = torch.argsort(flat, stable=True)
    output_perm = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
    return {"counts": counts, "offsets": offsets, "input_perm": order // K, "output_perm": output_perm}
