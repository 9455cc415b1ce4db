"""The threads a server keeps work on, off the event loop: the bounded run executor (`RunExecutor`:
run workers, admission, runs staged on the loop) and the budgeted threads that validate graphs and
plan runs (`CompilerPool`)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from segfuse.compiler.limits import BudgetExceeded, budget

from .errors import ApiError, too_large
from .settings import Settings
from .worker import RunWorkers


def within_budget(what: str, work: int, seconds: float, fn, *args):
    """fn(*args) under the compiler's work budget (compiler/limits.py); 413 past it."""
    with budget(what, work, seconds, "max_plan_work", "max_plan_seconds"):
        try:
            return fn(*args)
        except BudgetExceeded as e:
            raise too_large(str(e), ["graph"]) from None


class CompilerPool:
    """Threads for compiler work a request waits for (validating a graph, planning a run), each
    call under the work budget (settings max_plan_work, max_plan_seconds; 413 past it).

    Their own threads, not asyncio's default executor (buffer bodies, transfers, shared-memory
    registration), the run workers or the event loop: a graph that is slow to validate or plan
    delays only requests waiting for the same kind of work, and at most for the budget. At most
    `max_waiting` calls wait for a thread; more are refused with 429."""

    threads = 2
    max_waiting = 32

    def __init__(self, name: str, what: str, settings: Settings):
        self.name = name
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"segfuse-{name}")
        self.what, self.work, self.seconds = what, settings.max_plan_work, settings.max_plan_seconds
        self.pending = 0  # calls queued or running (counted on the event loop)

    async def call(self, fn, *args):
        """fn(*args) on a thread of the pool, under the budget."""
        if self.pending >= self.threads + self.max_waiting:
            limit = self.threads + self.max_waiting
            raise ApiError(429, f"too many requests at once need {self.what} ({self.pending} waiting or running, "
                                f"at most {limit}); retry later", [{"loc": [], "msg": f"busy {self.what}"}],
                           {"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        self.pending += 1
        done = self.pool.submit(self._run, fn, args)
        # counted out when the thread is done, not when a client goes away (the work goes on)
        done.add_done_callback(lambda _: self._finished_on(loop))
        return await asyncio.wrap_future(done)

    def _finished_on(self, loop) -> None:
        try:
            loop.call_soon_threadsafe(self._finished)
        except RuntimeError:  # the loop closed while the thread worked (the app stopped)
            pass

    def _finished(self) -> None:
        self.pending -= 1

    def _run(self, fn, args):
        return within_budget(self.what, self.work, self.seconds, fn, *args)

    def shutdown(self) -> None:
        # A fresh pool (its threads start on first use) in place of the old: an app's lifespan may
        # run again in the same process, and validation must work then too (it answered 500).
        old, self.pool = self.pool, ThreadPoolExecutor(self.threads, thread_name_prefix=f"segfuse-{self.name}")
        old.shutdown(wait=False, cancel_futures=True)


class RunExecutor:
    """Run workers (server/worker.py) for runs, a thread pool for other work off the loop (plans),
    and a bound on runs admitted (queued or running).

    Beyond the bound a run is refused with 429 and Retry-After (the server is healthy, only busy;
    503 stays reserved for "not ready")."""

    def __init__(self, workers: RunWorkers, max_admitted: int, initializer=None,
                 plan_budget: tuple[int, float] | None = None):
        self.workers = workers
        self.plan_budget = plan_budget  # (work units, seconds) of `call`
        self._staged: list = []
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="segfuse-aux", initializer=initializer)
        self.max_admitted = max_admitted
        self.admitted = 0
        self._idle: asyncio.Event | None = None

    def admit(self) -> None:
        """Count a run in, or refuse it (429); `release` counts it out when its work is done."""
        if self.admitted >= self.max_admitted:
            raise ApiError(429, f"too many runs queued ({self.admitted}, the limit is {self.max_admitted}); "
                                "retry later", [{"loc": [], "msg": "run queue full"}], {"Retry-After": "1"})
        self.admitted += 1

    def stage(self, run) -> None:
        """A warm run on small inputs (it only launches prepared kernels): it runs on the event
        loop, with the other such runs of the same turn of the loop, as one batch when the turn
        ends. Measured on the H200 host (benchmarks/README.md): handing these to a worker thread
        costs more in thread hand-offs and GIL contention than their launches take."""
        self._staged.append(run)
        if len(self._staged) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        runs, self._staged = self._staged, []
        for k in range(0, len(runs), self.workers.max_batch):
            self.workers.run_here(runs[k:k + self.workers.max_batch])

    def release(self) -> None:
        self.admitted -= 1
        if self._idle is not None and not self.admitted:
            self._idle.set()

    async def call(self, fn, *args):
        """Run fn(*args) on a helper thread (planning; not runs), under the plan budget if any."""
        if self.plan_budget is None:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, within_budget, "planning", *self.plan_budget, fn, *args)

    async def drain(self) -> None:
        """Wait until every admitted run has finished."""
        while self.admitted:
            self._idle = asyncio.Event()
            await self._idle.wait()
        self._idle = None

    def shutdown(self) -> None:
        self.workers.stop()
        self.pool.shutdown(wait=True, cancel_futures=True)
