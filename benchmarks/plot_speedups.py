"""Plot a saved bench_gpu.json (speedups over torch eager against the targets), as `segfuse bench` does.

    python benchmarks/plot_speedups.py benchmarks/results/bench_gpu-2026-11-30-0036.json docs/bench_gpu.png
"""

import argparse
import json
from pathlib import Path

from segfuse.cli.client_cmds import plot_bench

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Speedups over torch eager of a bench_gpu.json, as a PNG.")
    ap.add_argument("results", type=Path, help="a bench_gpu.json")
    ap.add_argument("png", type=Path, help="where the plot goes (docs/bench_gpu.png for the README's)")
    args = ap.parse_args()
    print(plot_bench(json.loads(args.results.read_text()), args.png))
