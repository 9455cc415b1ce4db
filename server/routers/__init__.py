"""One router per resource: health, buffers, fusions, infer; and the KServe v2 / Triton protocol
routes (statistics, versions, model repository and configuration, trace and logging settings)."""

from . import repository, stats, tracelog, versions

PROTOCOL_ROUTERS = (stats.router, versions.router, repository.router, tracelog.router)
