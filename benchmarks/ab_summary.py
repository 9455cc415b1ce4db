"""Head / base ratios of bench_gpu.json runs of two trees (benchmarks/device_ab_ray.sh): per row the
median over rounds of each tree, then per implementation the median and range of the row ratios, next
to torch eager's ratio in the same rows (code neither tree changes: the machine's drift).

    python benchmarks/ab_summary.py base_1.json base_2.json -- head_1.json head_2.json
"""

from __future__ import annotations

import json
import statistics
import sys


def medians(paths: list[str], key: str = "us") -> dict:
    """(bench, impl) -> the median over the runs of `key`."""
    vals: dict = {}
    for p in paths:
        for r in json.load(open(p))["rows"]:
            v = r.get(key)
            if isinstance(v, (int, float)) and v == v and v > 0:
                vals.setdefault((r["bench"], r["impl"]), []).append(float(v))
    return {k: statistics.median(v) for k, v in vals.items()}


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    base, head = medians(argv[:cut]), medians(argv[cut + 1:])
    by_impl: dict = {}
    for k in sorted(set(base) & set(head)):
        by_impl.setdefault(k[1], []).append(head[k] / base[k])
    print(f"{len(argv[:cut])} base run(s), {len(argv[cut + 1:])} head run(s); head / base of each row's median\n")
    print("| implementation | rows | median | range |\n| --- | ---: | ---: | --- |")
    for impl, rs in by_impl.items():
        print(f"| {impl} | {len(rs)} | {statistics.median(rs):.2f} | {min(rs):.2f}-{max(rs):.2f} |")
    hb, hh = medians(argv[:cut], "host overhead us"), medians(argv[cut + 1:], "host overhead us")
    for k in sorted(set(hb) & set(hh)):
        print(f"\nhost overhead, {k[0]} ({k[1]}): {hb[k]:.1f} -> {hh[k]:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
