"""The segmenter (issue 3): a validated fusion + the sizes of one run -> a `Plan`.

The pipeline is `pipeline.py` (`segment`, `plan_checks`); its parts: `graph.py` (the working
graph), `place.py` (multi-block placement), `buffers.py` (buffers, lifetimes, reuse),
`capability.py` (what codegen can emit), `shapes.py` (shape classes, `Checks`), `sort_epilogue.py`
(the sort epilogue's post-pass), `cache.py` (`PlanCache`), `reference.py` (a simpler reference
planner for tests and benchmarks). See docs/segmenter.md.
"""

from .pipeline import plan_checks, segment

__all__ = ["plan_checks", "segment"]
