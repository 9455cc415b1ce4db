"""Run workers: threads that take every run waiting in the queue as one batch.

A worker thread blocks on the queue, then drains up to `max_batch` waiting runs and hands them to
`execute(batch)` (launch each run back to back, wait for the device once), then passes the batch
and what `execute` returned (or raised) back to the event loop with one `call_soon_threadsafe`,
where `finish(batch, done)` commits each run's outputs and answers its request. One loop wake-up and one device wait per batch instead of per
run is what lets the rate grow with the number of connections.

Several workers (`Settings.run_workers`) take batches from the same queue; on the GPU each works
on its own CUDA stream (the runtime keeps one per thread). Runs that touch the same buffer never
overlap, whatever the worker: a run's pins are taken on the event loop before it is queued and
released only after its outputs were committed (server/runs.py). The runs are records
(server/run_records.py); a worker never changes them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("segfuse.server")

_STOP = object()


class RunWorkers:
    def __init__(self, workers: int, max_batch: int, execute: Callable[[list], Any],
                 finish: Callable[[list, Any], None], loop, initializer: Callable[[], None] | None = None):
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._execute, self._finish, self._loop = execute, finish, loop
        self._initializer = initializer
        self.in_flight = 0
        self._threads = [threading.Thread(target=self._work, name=f"segfuse-run-{k}", daemon=True)
                         for k in range(workers)]
        for t in self._threads:
            t.start()

    @property
    def idle(self) -> bool:
        """No run queued or running (read on the event loop, which counts runs in and out)."""
        return not self.in_flight

    def submit(self, runs: list) -> None:
        """Queue runs (from the event loop), together; `finish` gets them back on the loop."""
        self.in_flight += len(runs)
        self._queue.put(runs)

    def run_here(self, batch: list) -> None:
        """Execute and finish a batch on the calling thread (the event loop: runs staged there)."""
        self._finish(batch, self._executed(batch))

    def _executed(self, batch: list):
        """What `execute(batch)` returned, or the exception it raised (a bug in execute: the batch
        fails rather than hangs)."""
        try:
            return self._execute(batch)
        except BaseException as e:
            log.exception("run batch failed")
            return e

    def _finished(self, batch: list, done) -> None:
        self.in_flight -= len(batch)
        self._finish(batch, done)

    def stop(self) -> None:
        """Finish the queued runs, then end the threads."""
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join()

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer()
        q, limit = self._queue, self.max_batch
        while True:
            runs = q.get()
            if runs is _STOP:
                return
            batch, stop = list(runs), False
            while len(batch) < limit:
                try:
                    runs = q.get_nowait()
                except queue.Empty:
                    break
                if runs is _STOP:
                    stop = True
                    break
                batch.extend(runs)  # (a batch may pass the limit by the last group's size)
            self._loop.call_soon_threadsafe(self._finished, batch, self._executed(batch))
            if stop:
                return
