"""segfuse's Python client: talk to a segfuse server over HTTP (sync `Client`, async `AsyncClient`).

    import numpy as np
    from segfuse.client import Buffer, Client

    with Client("127.0.0.1:8000") as c:
        c.put("ids_0", np.random.randint(0, 16, (32, 4)))
        res = c.run("examples/moe_problem_sizes.json", inputs={"topk_ids": Buffer("ids_0")})
        print(res["counts"], res.timings_us)
"""

from ._client import AsyncClient, Client
from ._errors import SegfuseError
from ._regions import SystemRegion
from ._types import Buffer, FusionRef, Region, RunResult

__all__ = ["AsyncClient", "Buffer", "Client", "FusionRef", "Region", "RunResult", "SegfuseError", "SystemRegion"]
