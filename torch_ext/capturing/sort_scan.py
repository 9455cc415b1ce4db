"""Sorts (sort, argsort, topk) and scans (cumsum, cumprod, cummax, cummin).

Each is the registry op of its name with PyTorch's argument order (sort.stable's keywords
included), so the generic lowering takes them, and the capture's decomposition table keeps them
whole (argsort is not rewritten into sort; msort decomposes into sort). segfuse always sorts
stably: sort(stable=False), whose order of ties PyTorch leaves open, gets the stable order, and
topk(sorted=False) returns its values sorted, an order PyTorch allows. What this module adds is
the way to write the sorting and scanning ops segfuse lacks, named in their refusals.
"""

from __future__ import annotations

from .lowering import suggest

suggest("logcumsumexp", "m = x.amax(dim, keepdim=True); m + torch.log(torch.cumsum(torch.exp(x - m), dim)) "
                        "(exact for prefixes whose sums do not underflow)")
suggest("bincount", "torch.zeros(n, dtype=torch.int64).scatter_add_(0, x, torch.ones_like(x)) with a fixed n")
suggest("histc", "torch.zeros(bins).scatter_add_(0, bin_index, torch.ones_like(x)) with bin_index computed "
                 "from x, min and max")
suggest("searchsorted", "(sorted_seq.unsqueeze(0) < values.unsqueeze(-1)).sum(-1) (side='left'; <= for "
                        "side='right')")
suggest("bucketize", "(boundaries.unsqueeze(0) < x.unsqueeze(-1)).sum(-1) (right=False)")
suggest("unique", "torch.sort(x) (unique's length depends on the data)")
suggest("unique_consecutive", "torch.sort(x) (unique's length depends on the data)")
suggest("_unique2", "torch.sort(x) (unique's length depends on the data)")
