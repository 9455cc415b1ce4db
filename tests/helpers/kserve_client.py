"""KServe's own REST client (kserve.InferenceRESTClient), for fresh_process.call: a test process
with tritonclient.grpc loaded cannot import kserve (helpers/fresh_process.py). Each function makes
its calls and returns plain values.
"""

from __future__ import annotations

import asyncio


def _run(timeout: float, coro_fn):
    from kserve import InferenceRESTClient, RESTConfig

    async def main():
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=timeout))
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def _error(e) -> dict:
    return {"status": e.response.status_code, "text": str(e)}


def health(url: str, name: str, timeout: float) -> dict:
    async def go(c):
        return {"live": await c.is_server_live(url), "ready": await c.is_server_ready(url),
                "model_ready": await c.is_model_ready(url, name),
                "unknown_model_ready": await c.is_model_ready(url, "no_such_fusion")}

    return _run(timeout, go)


def not_ready(url: str, timeout: float) -> dict:
    """is_server_ready on a server that is not ready (its error), then is_server_live."""
    import httpx

    async def go(c):
        try:
            await c.is_server_ready(url)
            error = None
        except httpx.HTTPStatusError as e:
            error = _error(e)
        return {"ready_error": error, "live": await c.is_server_live(url)}

    return _run(timeout, go)


def infer(url: str, name: str, tensors: dict, binary: bool, timeout: float, request_id: str | None = None,
          outputs: list | None = None, body_name: str | None = None) -> dict:
    """An infer on model `name` of `tensors` (name -> (numpy array, KServe datatype)), the body naming
    `body_name` (default: the same model); the answer's id, model name, outputs as numpy arrays and
    content-encoding, or the HTTP error."""
    import httpx
    from kserve import InferInput, InferRequest
    from kserve.protocol.infer_type import RequestedOutput

    inputs = []
    for k, (a, dtype) in tensors.items():
        i = InferInput(k, list(a.shape), dtype)
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
    requested = [RequestedOutput(o, {"binary_data": binary}) for o in outputs] if outputs else None
    req = InferRequest(body_name or name, inputs, request_id=request_id, request_outputs=requested)
    headers: dict = {}

    async def go(c):
        try:
            res = await c.infer(url, req, model_name=name, response_headers=headers)
        except httpx.HTTPStatusError as e:
            return {"error": _error(e)}
        return {"model_name": res.model_name, "id": res.id, "outputs": [o.as_numpy() for o in res.outputs],
                "content_encoding": headers.get("content-encoding")}

    return _run(timeout, go)



def grpc_beside_kserve(graph: dict, ids) -> dict:
    """In a process that has imported kserve (whose generated messages define protobuf package
    `inference` in the default pool): segfuse's app with --grpc-port starts, and kserve's own gRPC
    client (InferenceGRPCClient) asks it for readiness and runs `graph` on `ids`."""
    import httpx
    import kserve  # first, as an embedding process would have
    from asgi_lifespan import LifespanManager
    from kserve import InferenceGRPCClient, InferInput, InferRequest
    from segfuse.server import create_app
    from segfuse.server.app import wait_ready
    from segfuse.server.settings import Settings

    async def main():
        app = create_app(Settings(backend="numpy", grpc_port=0))
        async with LifespanManager(app):
            await wait_ready(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://segfuse") as http:
                assert (await http.post("/v2/fusions", json=graph)).status_code == 201
            client = InferenceGRPCClient(f"127.0.0.1:{app.state.grpc_port}", timeout=60)
            try:
                inp = InferInput("topk_ids", list(ids.shape), "INT64")
                inp.set_data_from_numpy(ids)
                res = await client.infer(InferRequest(graph["name"], [inp]))
                return {"kserve": kserve.__name__, "live": await client.is_server_live(),
                        "model_ready": await client.is_model_ready(graph["name"]),
                        "counts": res.outputs[0].as_numpy()}
            finally:
                await client.close()

    return asyncio.run(main())
