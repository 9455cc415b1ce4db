"""How `segfuse explain` prints a plan: one block of wrapped lines per segment (readable at 80
columns), sizes in plain arithmetic (`ceil(max(16, K*T)/256)`) with their value at the given sizes,
and the shared-memory limit of the visible GPU (else of the documented target, H200 / sm_90)."""

from __future__ import annotations

import re
import shutil
import textwrap

# The documented target (docs/architecture.md, H200 / sm_90): per-block shared memory.
TARGET_SMEM = {"name": "H200 (sm_90), the documented target; no GPU visible",
               "optin": 227 * 1024, "default": 48 * 1024}

_FUNCS = {"ceiling": "ceil", "Max": "max", "Min": "min", "floor": "floor", "Mod": "mod", "Abs": "abs"}
_FUNC_RE = re.compile(r"\b(" + "|".join(_FUNCS) + r")\(")


def plain(text) -> str:
    """A sympy size printed as plain arithmetic: ceiling(Max(B, B*N)/256) -> ceil(max(B, B*N)/256)."""
    return _FUNC_RE.sub(lambda m: _FUNCS[m[1]] + "(", str(text)).replace("**", "^")


def size(expr, env: dict[str, int]) -> str:
    """`plain(expr)`, followed by its value where the given sizes determine it: '4*T = 16384'."""
    text = plain(expr)
    if isinstance(expr, int) or not env:
        return text
    try:
        import sympy
        from segfuse.compiler.shapes import symbol

        value = sympy.sympify(str(expr), locals={k: symbol(k) for k in env}).subs(
            {symbol(k): v for k, v in env.items()})
        if value.is_Integer or value.is_Boolean:
            return f"{text} = {value}"
    except (sympy.SympifyError, TypeError, ValueError, SyntaxError):
        pass
    return text


def kib(n: int) -> str:
    if n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def device_smem() -> dict:
    """Per-block shared memory of GPU 0 where CuPy sees one, else the documented target's."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            p = cupy.cuda.runtime.getDeviceProperties(0)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            return {"name": f"{name} (sm_{p['major']}{p['minor']}), GPU 0",
                    "optin": int(p.get("sharedMemPerBlockOptin") or p["sharedMemPerBlock"]),
                    "default": int(p["sharedMemPerBlock"])}
    except Exception:  # no CuPy, no driver, no device: the documented target
        pass
    return TARGET_SMEM


def _launch(seg, fusion, env: dict) -> str:
    h = seg.hints
    if not h.get("launch", True):
        return "no launch (a view)"
    if seg.routine is not None:  # a library segment: what runs, from its op's registry entry
        return seg.routine.describe(next((fusion.nodes[p].op for p in seg.nodes
                                          if fusion.nodes[p].op.library_sort is not None), None))
    if h.get("single_block"):
        return f"1 block x {h['threads']} threads, intermediates in shared memory {size(h['intermediate_smem_bytes'], env)} B"
    blocks = h.get("blocks")
    return f"{size(blocks, env)} block{'' if blocks == 1 else 's'} x {h.get('threads')} threads"


def _ops(seg, fusion) -> str:
    parts = [f"{fusion.nodes[p].op.name}->{fusion.nodes[p].outputs[0]}" for p in seg.nodes]
    for c in sorted(seg.copies, key=lambda c: -c.at):
        parts.insert(c.at, f"copy {c.src}->{c.dst}")
    return ", ".join(parts)


def plan_lines(plan, fusion, env: dict[str, int], smem: dict, budget: int, width: int | None = None) -> list[str]:
    """The plan as lines of at most `width` columns (default: the terminal's, at least 60)."""
    width = max(60, width or shutil.get_terminal_size((80, 24)).columns)
    budget_text = f"(<= {budget})"
    out: list[str] = []

    def field(label: str, text: str, indent: int = 4) -> None:
        head = " " * indent + (f"{label:<9}" if indent else f"{label}: ")
        out.extend(textwrap.wrap(text, width, initial_indent=head, subsequent_indent=" " * len(head),
                                 break_long_words=False, break_on_hyphens=False) or [head.rstrip()])

    n, k = len(plan.segments), plan.kernel_count
    out += textwrap.wrap(f"{fusion.name}: segments {n}, launches {k} (shape class {plan.shape_class})", width,
                         break_long_words=False)
    for seg in plan.segments:
        out.append("")
        out.append(f"  #{seg.id} {seg.kind.value}: {_launch(seg, fusion, env)}")
        field("ops", _ops(seg, fusion))
        field("reads", ", ".join(seg.inputs) or "-")
        field("writes", ", ".join(seg.outputs) or "-")
        reason = plain(seg.reason).replace(budget_text, f"(<= the planner's budget of {kib(budget)}, see below)")
        field("reason", reason)
        for a in seg.aliases:
            field("", f"[{a.mode.value}] {a.tensor} -> buffer of {a.buffer}: {a.why}")
    out.append("")
    field("buffers", "; ".join(f"#{b.id} {b.kind} {size(b.nbytes, env)} B [{' '.join(b.tensors)}]"
                               for b in plan.buffers), indent=0)
    if plan.views:
        field("views", "(no data moves) " + ", ".join(f"{t}->{b}" for t, b in plan.views.items()), indent=0)
    for c in plan.heuristics.get("checks", []):
        field("size test", f"{plain(c['what'])}: {plain(c['test'])} -> {c['holds']}", indent=0)
    field("shared memory", f"{kib(smem['optin'])} per block opt-in, {kib(smem['default'])} by default on "
                           f"{smem['name']}. The planner's single-block budget is {kib(budget)} "
                           "(Capability.smem_budget_bytes): intermediates past the device's limit spill "
                           "to global scratch.", indent=0)
    return out
