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


if __name__ == "__main__":
    # capture once with T dynamic, then run the graph on the NumPy backend at two T, next to torch
    import segfuse.torch

    fd = segfuse.torch.capture(moe_prologue, torch.randint(0, E, (1, K)), dynamic={"topk_ids": {0: "T"}})
    print(f"captured {fd.fusion().name}: inputs {[i['shape'] for i in fd.to_dict()['inputs']]}, "
          f"outputs {[o.name for o in fd.fusion().outputs]}")
    for T in (3, 50):
        ids = torch.randint(0, E, (T, K))
        got = fd.execute({"topk_ids": ids.numpy()})
        same = all((got[k] == v.numpy()).all() for k, v in moe_prologue(ids).items())
        print(f"T={T}: equal to torch: {same}")
