"""A/B launcher for benchmarks/ab_staging.sh: `segfuse serve` with warm runs executed at once on the
event loop, one by one, instead of staged into one batch per loop turn (RunExecutor.stage)."""

import sys
import time

import segfuse.server.runtime as runtime
from segfuse.cli import main


def stage(self, job):
    job.t_queued = time.perf_counter()
    self._run_here([job])


runtime.RunExecutor.stage = stage
sys.exit(main())
