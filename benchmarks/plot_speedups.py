"""Plot a saved bench_gpu.json (speedups over torch eager against the targets), as `segfuse bench` does.

    python benchmarks/plot_speedups.py benchmarks/results/bench_gpu-2026-11-29-2020.json docs/bench_gpu.png
"""

import json
import sys
from pathlib import Path

from segfuse.cli.client_cmds import plot_bench

if __name__ == "__main__":
    print(plot_bench(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])))
