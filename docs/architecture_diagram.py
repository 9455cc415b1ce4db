"""Draws docs/architecture.png, the pipeline diagram of docs/architecture.md.

    python docs/architecture_diagram.py      # needs matplotlib (the `bench` extra)
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# (key, label, x, y, colour); x, y are box centres in axis units.
BOXES = [
    ("json", "graph JSON\nor FusionDefinition", 1.2, 4.4, "#e8e8e8"),
    ("client", "segfuse.client\nClient / AsyncClient", 1.2, 2.8, "#e8e8e8"),
    ("cli", "segfuse CLI", 1.2, 1.2, "#e8e8e8"),
    ("reg", "FusionRegistry\nid = content hash", 4.0, 4.4, "#cfe2f3"),
    ("api", "REST /v2, KServe v2\nparse -> admit ->\nlaunch -> commit", 4.0, 2.8, "#cfe2f3"),
    ("store", "BufferStore\nnamed buffers, pins", 4.0, 1.2, "#cfe2f3"),
    ("validate", "validate\nschema, op registry,\ndtype + shape", 6.8, 4.4, "#d9ead3"),
    ("engine", "Engine\nplan cache,\none Backend", 6.8, 2.8, "#d9ead3"),
    ("segment", "segment\nPlan: segments and\ntyped decisions", 6.8, 1.2, "#d9ead3"),
    ("cupy", "CupyBackend\n(Backend)", 9.4, 4.4, "#fce5cd"),
    ("numpy", "NumpyBackend\n(Backend; the oracle)", 9.4, 1.2, "#fff2cc"),
    ("codegen", "codegen: a renderer\nper kernel family,\nCodegenOptions", 12.0, 4.4, "#fce5cd"),
    ("cache", "kernel cache\nNVRTC via CuPy", 12.0, 2.8, "#fce5cd"),
    ("gpu", "launch on\nGPU buffers", 14.6, 2.8, "#fce5cd"),
    ("host", "run on\nhost arrays", 14.6, 1.2, "#fff2cc"),
]
ARROWS = [("json", "client"), ("cli", "client"), ("client", "api"), ("api", "reg"), ("api", "store"),
          ("reg", "validate"), ("api", "engine"), ("engine", "segment"), ("engine", "cupy"), ("engine", "numpy"),
          ("cupy", "codegen"), ("codegen", "cache"), ("cache", "gpu"), ("numpy", "host")]
W, H = 2.1, 1.05


def _edge(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float]:
    """Where the line from box centre (x0, y0) towards (x1, y1) leaves the box (plus its padding)."""
    dx, dy = x1 - x0, y1 - y0
    hw, hh = W / 2 + 0.06, H / 2 + 0.06
    t = min(hw / abs(dx) if dx else float("inf"), hh / abs(dy) if dy else float("inf"))
    return x0 + dx * t, y0 + dy * t


def main(path: str = os.path.join(HERE, "architecture.png")) -> str:
    fig, ax = plt.subplots(figsize=(15.6, 5.4), dpi=110)
    ax.set_xlim(0, 15.8)
    ax.set_ylim(0.3, 5.3)
    ax.axis("off")
    pos = {}
    for key, label, x, y, colour in BOXES:
        pos[key] = (x, y)
        ax.add_patch(FancyBboxPatch((x - W / 2, y - H / 2), W, H, boxstyle="round,pad=0.04",
                                    facecolor=colour, edgecolor="#444444", linewidth=1.1))
        ax.text(x, y, label, ha="center", va="center", fontsize=9)
    for a, b in ARROWS:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.add_patch(FancyArrowPatch(_edge(x0, y0, x1, y1), _edge(x1, y1, x0, y0), arrowstyle="-|>",
                                     mutation_scale=12, color="#555555", shrinkA=0, shrinkB=0, linewidth=1.0))
    for x, text in ((1.2, "caller"), (4.0, "segfuse.server"), (9.4, "segfuse.compiler"), (14.6, "device")):
        ax.text(x, 5.15, text, ha="center", va="center", fontsize=11, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(main())
