"""segfuse's Python client: talk to a segfuse server over HTTP (sync `Client`, async `AsyncClient`).

    import numpy as np
    from segfuse.client import Buffer, Client

    with Client("127.0.0.1:8000") as c:
        c.put("ids_0", np.random.randint(0, 16, (32, 4)))
        res = c.run("examples/moe_problem_sizes.json", inputs={"topk_ids": Buffer("ids_0")})
        print(res["counts"], res.timings_us)
"""

import warnings

from ._client import AsyncClient, Client
from ._errors import ClientError
from ._regions import SystemRegion
from ._types import Buffer, FusionRef, Region, RunResult

__all__ = ["AsyncClient", "Buffer", "Client", "ClientError", "FusionRef", "Region", "RunResult", "SystemRegion"]


def __getattr__(name: str):
    # The client's exception was called SegfuseError, like the compiler's unrelated base class
    # (segfuse.compiler.SegfuseError); the old name still works, with a warning.
    if name == "SegfuseError":
        warnings.warn("segfuse.client.SegfuseError is now segfuse.client.ClientError", DeprecationWarning,
                      stacklevel=2)
        return ClientError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
