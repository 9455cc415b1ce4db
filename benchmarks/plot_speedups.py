"""Plot a bench_gpu.json as speedups over torch eager (log scale), one bar per segfuse path.

    python benchmarks/plot_speedups.py benchmarks/results/bench_gpu-2026-11-29-2020.json docs/bench_gpu.png
"""

from __future__ import annotations

import json
import sys


def speedups(results: dict) -> tuple[list[str], dict[str, list[float]], list[float]]:
    """(labels, {path: speedups}, targets) from the run's summary ratios."""
    s = results["summary"]
    labels, engine, runner, targets = [], [], [], []
    labels.append("chain 2^28 f32\n(vs torch.compile)")
    engine.append(s["chain_vs_compile"])
    runner.append(float("nan"))
    targets.append(0.95)
    for bins, target in (("256", 40.0), ("16777216", 1.0)):
        labels.append(f"scatter-add\n{bins} bins")
        engine.append(s[f"scatter_{bins}_vs_eager"])
        runner.append(float("nan"))
        targets.append(target)
    for k, v in s.items():
        if k.startswith("moe_") and not k.endswith("_runner") and k.endswith("int64"):
            name, t = k[4:].rsplit("_T", 1)
            labels.append(f"{name}\nT={t.split('_')[0]}")
            engine.append(v)
            runner.append(s.get(k + "_runner", float("nan")))
            targets.append(1.0 if t.startswith("65536") else 3.0)
    return labels, {"Engine.run": engine, "runner (serving fast path)": runner}, targets


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.load(open(src))
    labels, series, targets = speedups(results)
    fig, ax = plt.subplots(figsize=(14, 5))
    n = len(series)
    width = 0.8 / n
    for i, (name, vals) in enumerate(series.items()):
        ax.bar([x + (i - (n - 1) / 2) * width for x in range(len(labels))], vals, width, label=name)
    ax.scatter(range(len(labels)), targets, marker="_", s=400, color="black", label="target", zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speedup over torch eager (x)")
    ax.set_xticks(range(len(labels)), [lb.replace("\n", " ") for lb in labels], fontsize=8, rotation=40, ha="right")
    meta = results.get("meta", {})
    ax.set_title(f"segfuse on {meta.get('gpu', '?')}, {meta.get('date', '')} (torch {meta.get('torch', '?')}); "
                 "MoE rows: topk 8, 256 experts, int64 ids")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
