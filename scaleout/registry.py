"""What a shard must know after Ray replaced it: that it is a replacement (its namespaces' buffers are
gone: its 404s say so) and which fusion registrations its predecessor had (replayed into the new
replica before it takes a request). Kept per shard id by `Registry`, which on Ray is one detached,
named actor (`segfuse-registry`) that every shard replica finds or creates itself; it outlives the
replicas, so registrations made through the router and by direct-mode clients both come back.

If the registry actor itself is lost (its node died), Ray restarts it empty: shards started after
that neither know they replaced another nor get registrations back (give shards a fusion directory
where that matters, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging

REGISTRY_NAME = "segfuse-registry"
RAY_NAMESPACE = "segfuse"
TIMEOUT_S = 30.0
log = logging.getLogger("segfuse.scaleout")


class Registry:
    """Per shard id: the incarnation that last started, and the registrations that succeeded on it
    and on its predecessors, in order (requests as plain values)."""

    def __init__(self):
        self._incarnations: dict[str, str] = {}
        self._registrations: dict[str, list[tuple]] = {}

    def start(self, shard: str, incarnation: str) -> tuple[str | None, list[tuple]]:
        """A replica of `shard` starts: (the incarnation it replaces or None, the registrations to replay)."""
        previous = self._incarnations.get(shard)
        self._incarnations[shard] = incarnation
        return previous, list(self._registrations.get(shard, []))

    def record(self, shard: str, call: tuple) -> None:
        remember(self._registrations.setdefault(shard, []), call)


# The headers a registration needs again when it is replayed; the others (request id, namespace,
# user agent) differ between two requests that register the same thing.
_REPLAYED = {b"content-type", b"content-encoding", b"content-length", b"authorization"}


def replayable(call: tuple) -> tuple:
    """A registration as it is kept: its headers cut to those that change what it does."""
    method, raw_path, query, headers, body = call
    return method, raw_path, query, [(k, v) for k, v in headers if k.lower() in _REPLAYED], body


def remember(calls: list, call: tuple) -> None:
    """Append `call` to `calls`, dropping an earlier identical one: registering the same graph
    again (every namespace's client may) does not grow the list, and replaying the list still
    ends in the same fusions (the later call has the last word on its name)."""
    call = replayable(call)
    if call in calls:
        calls.remove(call)
    calls.append(call)


def actor():
    """The cluster's registry actor, created on first use (inside a Ray worker: a shard replica)."""
    import ray

    return ray.remote(Registry).options(name=REGISTRY_NAME, namespace=RAY_NAMESPACE, lifetime="detached",
                                        get_if_exists=True, num_cpus=0, max_restarts=-1).remote()


async def call(registry, method: str, *args):
    """`registry.method(*args)`: a local Registry (tests), or the actor; None when it does not answer
    in TIMEOUT_S (the shard then works on, without what the registry would have told it)."""
    if isinstance(registry, Registry):
        return getattr(registry, method)(*args)
    try:
        return await asyncio.wait_for(getattr(registry, method).remote(*args), TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - any Ray failure: logged, the shard keeps serving
        log.warning("segfuse registry %s failed: %s", method, e)
        return None


def remove() -> None:
    """Kill the registry actor, if there is one (`serve_ray.stop` on a cluster that lives on)."""
    import ray

    try:
        ray.kill(ray.get_actor(REGISTRY_NAME, namespace=RAY_NAMESPACE))
    except ValueError:  # none
        pass
