"""A CupyRuntime for GPU tests that force a lowering: the runtime executes only plans it is handed
(the Engine plans), so runs handed no plan here are planned by the test's planner, once per graph
and sizes (the runtime's prepared entries are keyed by the plan)."""

from __future__ import annotations

from segfuse.compiler.cuda.backend import CupyBackend
from segfuse.compiler.cuda.runtime import CupyRuntime
from segfuse.compiler.segmenter.cache import SHARED_PLANS
from segfuse.compiler.segmenter.reference import simple_plan


class PlannedRuntime:
    """`planner(fusion, types) -> Plan` (None: the Engine's shared plan cache) in front of a
    CupyRuntime (`rt`, else a new one made with `kwargs`); every other attribute is the runtime's."""

    def __init__(self, planner=None, rt=None, **kwargs):
        self.rt = rt if rt is not None else CupyRuntime(**kwargs)
        self.planner = planner
        self._plans: dict = {}

    def plan_for(self, fusion, inputs: dict | None = None, shapes: dict | None = None, dtypes: dict | None = None):
        if inputs is not None:
            shapes, dtypes, _ = CupyBackend().read_inputs(fusion, inputs)
        bound = fusion.bind({k: tuple(v) for k, v in shapes.items()}, dtypes)
        if self.planner is None:
            return SHARED_PLANS.get(fusion, bound)[0]
        key = (fusion.id, tuple(sorted(bound.env.items())), tuple(sorted((k, str(v)) for k, v in (dtypes or {}).items())))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.planner(fusion, dict(bound.types))
        return plan

    def run(self, fusion, inputs: dict, plan=None, deferred: bool = False):
        return self.rt.run(fusion, inputs, plan if plan is not None else self.plan_for(fusion, inputs), deferred)

    def warmup(self, fusion, shapes: dict, plan=None, dtypes: dict | None = None):
        plan = plan if plan is not None else self.plan_for(fusion, shapes=shapes, dtypes=dtypes)
        return self.rt.warmup(fusion, shapes, plan, dtypes)

    def runner(self, fusion, inputs: dict, plan=None):
        return self.rt.runner(fusion, inputs, plan if plan is not None else self.plan_for(fusion, inputs))

    def prepared_call(self, fusion, inputs: dict, plan=None, deferred: bool = False):
        plan = plan if plan is not None else self.plan_for(fusion, inputs)
        return self.rt.prepared_call(fusion, inputs, plan, deferred)

    def kernel_time_us(self, fusion, inputs: dict, plan=None, reps: int = 20, warmup: int = 3) -> float:
        plan = plan if plan is not None else self.plan_for(fusion, inputs)
        return self.rt.kernel_time_us(fusion, inputs, plan, reps=reps, warmup=warmup)

    def __getattr__(self, name):
        return getattr(self.rt, name)


_RT = {}


def runtime(mode: str):
    """A runtime whose plans force a lowering: "grid" (every segment a grid kernel), "block" (single
    blocks where they fit); "plan": None (the segmenter's own plans)."""
    if mode == "plan":
        return None
    if mode not in _RT:
        small = {"grid": -1, "block": 1 << 62}[mode]
        _RT[mode] = PlannedRuntime(lambda f, types, s=small: simple_plan(f, types, small=s))
    return _RT[mode]
