"""One plot per workload of a bench_gpu.json whose rows carry the three modes (benchmarks/modes.py:
`us` per call, `pipelined us`, `gpu us`): for each workload, each implementation's three times
side by side (log scale, lower is better), its launches under its name.

    python benchmarks/plot_modes.py benchmarks/out/bench_gpu.json docs/plots/
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

MODES = (("us", "per call (synchronized)"), ("pipelined us", "pipelined"), ("gpu us", "GPU time"))


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def workloads(results: dict) -> dict:
    """{workload: [rows]} for the rows that measured at least one mode besides per call."""
    out: dict = {}
    for r in results.get("rows", []):
        if any(_finite(r.get(k)) for k, _ in MODES[1:]):
            out.setdefault(r["bench"], []).append(r)
    return out


def plot_modes(results: dict, out_dir: Path) -> list[Path]:
    """Write one PNG per workload into `out_dir`; the paths written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = results.get("meta", {})
    paths = []
    for bench, rows in workloads(results).items():
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows)), 4.5), dpi=110)
        width = 0.8 / len(MODES)
        for k, (key, label) in enumerate(MODES):
            vals = [r.get(key) if _finite(r.get(key)) else float("nan") for r in rows]
            ax.bar([i + (k - 1) * width for i in range(len(rows))], vals, width, label=label)
        names = [r["impl"] + (f"\n{r['launches']} launches" if isinstance(r.get("launches"), int) else "")
                 for r in rows]
        ax.set_xticks(range(len(rows)), names, fontsize=7, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("microseconds (lower is better)")
        ax.set_title(f"{bench}: {meta.get('gpu', '')} {meta.get('date', '')}".strip(), fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / (re.sub(r"[^A-Za-z0-9]+", "_", bench).strip("_") + ".png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="One PNG per workload of a bench_gpu.json measured in the three modes.")
    ap.add_argument("results", type=Path, help="a bench_gpu.json (benchmarks/out/ or benchmarks/results/)")
    ap.add_argument("out", type=Path, help="the folder for the PNGs (docs/plots/ for the docs' plots)")
    args = ap.parse_args()
    for p in plot_modes(json.loads(args.results.read_text()), args.out):
        print(p)
