"""The tools of the conformance cases (helpers/triton_cases.py, helpers/triton_cases_admin.py): a case is data, an
id and a probe that takes one server (a Target) and returns its observation (helpers/conformance.py). A probe asserts
what must hold on every server (answers equal to NumPy's); everything else is compared between the two.

`protocol` says which front door a probe speaks, so a gRPC variant adds cases beside these."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from helpers.conformance import body_shape, shape
from helpers.triton_pair import EXPERTS, TOPK, Target

TIMEOUT = 60
Observation = dict


@dataclass(frozen=True)
class Case:
    id: str
    probe: Callable[[Target], Observation]
    protocol: str = "http"


def case_list() -> tuple[list[Case], Callable]:
    """A list of cases and the decorator that appends a probe to it as a case: `@case("id")`."""
    cases: list[Case] = []

    def case(id: str, protocol: str = "http"):
        def add(probe):
            cases.append(Case(id, probe, protocol))
            return probe
        return add

    return cases, case


# ---- tools --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def client(t: Target):
    c = httpclient.InferenceServerClient(t.address, network_timeout=TIMEOUT, connection_timeout=TIMEOUT)
    try:
        yield c
    finally:
        c.close()


def raw(t: Target, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, t.url + path, timeout=TIMEOUT, **kw)


def answer(r: httpx.Response) -> Observation:
    """Status and body shape of a response."""
    return {"status": r.status_code, "body": body_shape(r.content)}


def rejection(r: httpx.Response) -> Observation:
    """Status of an error answer, and whether its body carries Triton's {"error": message}."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    return {"status": r.status_code,
            "error body": "has error: str" if isinstance(doc, dict) and isinstance(doc.get("error"), str) else "none"}


def called(fn, *args, **kwargs) -> str:
    """What tritonclient did: "ok", or "raises <status>"."""
    try:
        fn(*args, **kwargs)
    except InferenceServerException as e:
        return f"raises {e.status()}"
    return "ok"


def ids_of(seed: int = 0, tokens: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, EXPERTS, (tokens, TOPK), dtype=np.int64)


def counts_of(ids: np.ndarray) -> np.ndarray:
    """The oracle: NumPy's histogram of the ids."""
    return np.bincount(ids.reshape(-1), minlength=EXPERTS).astype(np.int64)


def ids_input(ids: np.ndarray, binary: bool = True):
    i = httpclient.InferInput("topk_ids", list(ids.shape), "INT64")
    i.set_data_from_numpy(ids, binary_data=binary)
    return i


def infer_body(ids: np.ndarray, **top) -> dict:
    return {"inputs": [{"name": "topk_ids", "shape": list(ids.shape), "datatype": "INT64",
                        "data": ids.reshape(-1).tolist()}], **top}


def checked_infer(t: Target, binary_in: bool, binary_out: bool, **kw) -> Observation:
    """tritonclient infer, its counts asserted equal to NumPy's; the response's JSON shape."""
    ids = ids_of(1)
    with client(t) as c:
        r = c.infer(t.model, [ids_input(ids, binary_in)],
                    outputs=[httpclient.InferRequestedOutput("counts", binary_data=binary_out)], **kw)
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids), err_msg=f"{t.kind}: counts")
    return {"counts": "NumPy's", "response": protocol_shape(r.get_response())}


def protocol_shape(response: dict) -> frozenset[str]:
    """The shape of an infer response without its top-level `parameters` (case "infer: response parameters")."""
    return shape({k: v for k, v in response.items() if k != "parameters"})


def tensors(meta: list) -> tuple:
    """(name, datatype, rank) of each tensor of model metadata (dims differ: Triton [-1, 8], segfuse [-1, -1])."""
    return tuple((x["name"], x["datatype"], len(x["shape"])) for x in meta)


def infer_raw(t: Target, body) -> httpx.Response:
    kw = {"content": body} if isinstance(body, (bytes, str)) else {"json": body}
    return raw(t, "POST", f"/v2/models/{t.model}/infer", **kw)


def client_infer(t: Target, **kw) -> Observation:
    """tritonclient infer with `kw`: "ok" (counts asserted equal to NumPy's) or how it raised."""
    ids = ids_of(5)
    with client(t) as c:
        try:
            r = c.infer(t.model, [ids_input(ids)], **kw)
        except InferenceServerException as e:
            return {"client": f"raises {e.status()}"}
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
    return {"client": "ok"}


def model_stats(t: Target) -> dict:
    with client(t) as c:
        return c.get_inference_statistics(t.model)["model_stats"][0]


@contextlib.contextmanager
def system_region(t: Target, nbytes: int, data: np.ndarray | None = None):
    """A system shared-memory region of `nbytes` registered on the server: (its name, its handle)."""
    name = f"sf_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", nbytes)
    try:
        if data is not None:
            shm.set_shared_memory_region(handle, [data])
        with client(t) as c:
            c.register_system_shared_memory(name, f"/{name}", nbytes)
            try:
                yield name, handle
            finally:
                c.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)
