"""The four MoE gate fusions of nvFuser's tests/cpp/test_moe.cpp, built with FusionDefinition.

These are the same graphs as examples/moe_*.json (tests/test_moe.py checks that the JSON the
builder produces is identical to the files). Run it as a script to execute all four on random
data and print the results:

    python examples/moe_builder.py                 # T=32, K=4, E=16 (nvFuser's test sizes)
    python examples/moe_builder.py -T 4096 -K 8 -E 256
    python examples/moe_builder.py --write         # regenerate the examples/moe_*.json files

Sizes that the graph allows to vary are symbolic: T (tokens) everywhere, K (topk) where only the
shape uses it, E (experts) where it comes from an input. Two sizes are constants of the graph,
as in nvFuser: the number of experts in ComputeProblemSizes (it is the size of a tensor the
graph creates) and topk in ComputeArgSort (it is a divisor: `t2 // topk`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from segfuse.compiler import FusionDefinition

HERE = os.path.dirname(os.path.abspath(__file__))


def problem_sizes(num_experts: int = 16, name: str = "moe_problem_sizes") -> FusionDefinition:
    """ComputeProblemSizes: tokens per expert, a histogram made with a scatter-add.

    counts = zeros([E], int64).scatter_add(0, topk_ids.flatten(), ones(T*K, int64))
    """
    with FusionDefinition(name) as fd:
        ids = fd.define_tensor("topk_ids", shape=["T", "K"], dtype="int64")
        flat = fd.ops.reshape(ids, [-1])
        zeros = fd.ops.full([num_experts], 0, "int64")
        ones = fd.ops.full_like(flat, 1, "int64")  # int64 even when the ids are int32
        counts = fd.ops.scatter(zeros, 0, flat, ones, reduce="add")
        fd.add_output(counts, "counts")
    return fd


def expert_offsets(name: str = "moe_expert_offsets") -> FusionDefinition:
    """ComputeExpertOffsets: exclusive prefix sum with the total at the end.

    expert_offsets = F.pad(cumsum(tokens_per_expert, 0), (1, 0))
    """
    with FusionDefinition(name) as fd:
        t = fd.define_tensor("tokens_per_expert", shape=["E"], dtype="int64")
        c = fd.ops.cumsum(t, 0)
        offsets = fd.ops.pad(c, [1, 0])
        fd.add_output(offsets, "expert_offsets")
    return fd


def blockscale_offsets(rounding: int = 128, name: str = "moe_blockscale_offsets") -> FusionDefinition:
    """ComputeExpertBlockScaleOffsets: two exclusive prefix sums, the second over counts
    rounded up to a multiple of `rounding`.

    expert_offsets     = F.pad(cumsum(t, 0), (1, 0))
    blockscale_offsets = F.pad(cumsum(ceil_div(t, 128) * 128, 0), (1, 0))
    """
    with FusionDefinition(name) as fd:
        t = fd.define_tensor("tokens_per_expert", shape=["E"], dtype="int64")
        offsets = fd.ops.pad(fd.ops.cumsum(t, 0), [1, 0])
        rounded = fd.ops.mul(fd.ops.ceil_div(t, rounding), rounding)
        blockscale = fd.ops.pad(fd.ops.cumsum(rounded, 0), [1, 0])
        fd.add_output(offsets, "expert_offsets")
        fd.add_output(blockscale, "blockscale_offsets")
    return fd


def argsort(topk: int = 4, name: str = "moe_argsort") -> FusionDefinition:
    """ComputeArgSort: sort the flattened ids descending (stable), then

    input_permutation  = s // topk                       (the token of each sorted slot)
    output_permutation = empty(T*K).scatter_(0, s, arange(T*K))   (the inverse permutation)

    topk is a literal of the graph (a divisor), so the ids' second dim is fixed to it.
    """
    with FusionDefinition(name) as fd:
        ids = fd.define_tensor("topk_ids", shape=["T", topk], dtype="int64")
        flat = fd.ops.reshape(ids, [-1])
        s = fd.ops.argsort(flat, 0, descending=True, stable=True)
        input_perm = fd.ops.floor_divide(s, topk)
        n = f"T*{topk}"
        out = fd.ops.scatter(fd.ops.full([n], 0, "int64"), 0, s, fd.ops.iota(n))
        fd.add_output(input_perm, "input_permutation")
        fd.add_output(out, "output_permutation")
    return fd


# name of the example file -> function that builds it
FUSIONS = {
    "moe_problem_sizes": lambda: problem_sizes(16),
    "moe_problem_sizes_e256": lambda: problem_sizes(256, name="moe_problem_sizes_e256"),
    "moe_expert_offsets": expert_offsets,
    "moe_blockscale_offsets": blockscale_offsets,
    "moe_argsort": argsort,
}


def format_graph(d: dict) -> str:
    """A graph as JSON text with one line per input, op and output (how the example files look)."""
    lines = ["{"]
    keys = list(d)
    for n, k in enumerate(keys):
        v = d[k]
        comma = "," if n < len(keys) - 1 else ""
        if isinstance(v, list) and v and k in ("inputs", "ops"):
            lines.append(f"  {json.dumps(k)}: [")
            lines += [f"    {json.dumps(x)}" + ("," if i < len(v) - 1 else "") for i, x in enumerate(v)]
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{comma}")
    return "\n".join(lines + ["}"]) + "\n"


def write_examples(directory: str = HERE) -> list[str]:
    paths = []
    for fname, build in FUSIONS.items():
        path = os.path.join(directory, fname + ".json")
        with open(path, "w") as f:
            f.write(format_graph(build().to_dict()))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-T", "--tokens", type=int, default=32)
    p.add_argument("-K", "--topk", type=int, default=4)
    p.add_argument("-E", "--experts", type=int, default=16)
    p.add_argument("--int32", action="store_true", help="int32 ids and counts inputs (SGLang's dtype)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help="write examples/moe_*.json and exit")
    args = p.parse_args(argv)
    if args.write:
        for path in write_examples():
            print(f"wrote {os.path.relpath(path)}")
        return 0

    rng = np.random.default_rng(args.seed)
    T, K, E = args.tokens, args.topk, args.experts
    N = T * K
    itype = np.int32 if args.int32 else np.int64

    def retype(fd: FusionDefinition) -> FusionDefinition:
        if not args.int32:
            return fd
        d = fd.to_dict()
        for i in d["inputs"]:
            i["dtype"] = "int32"
        return FusionDefinition.from_json(d)

    np.set_printoptions(threshold=40, edgeitems=8, linewidth=110)
    ids = rng.integers(0, E, size=(T, K)).astype(itype)
    tokens = rng.integers(0, N, size=(E,)).astype(itype)
    sort_ids = rng.integers(0, N, size=(T, K)).astype(itype)
    print(f"T={T} K={K} E={E} ids dtype={np.dtype(itype).name}")
    print("topk_ids[:4] =", ids[:4].tolist())
    r = retype(problem_sizes(E)).execute({"topk_ids": ids})
    print("ComputeProblemSizes      counts             =", r["counts"])
    r = retype(expert_offsets()).execute({"tokens_per_expert": tokens})
    print("tokens_per_expert =", tokens)
    print("ComputeExpertOffsets     expert_offsets     =", r["expert_offsets"])
    r = retype(blockscale_offsets()).execute({"tokens_per_expert": tokens})
    print("ComputeBlockScaleOffsets expert_offsets     =", r["expert_offsets"])
    print("                         blockscale_offsets =", r["blockscale_offsets"])
    r = retype(argsort(K)).execute({"topk_ids": sort_ids})
    print("ComputeArgSort           input_permutation  =", r["input_permutation"])
    print("                         output_permutation =", r["output_permutation"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
