"""The conformance cases of unknown names, methods and routes, statistics, the model repository, system shared
memory, trace and log settings and metrics (tests/test_triton_conformance.py; tools in helpers/triton_probe.py)."""

from __future__ import annotations

import re
import time
import uuid

import httpx
import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from helpers.conformance import shape
from helpers.triton_pair import EXPERTS, TOPK, Target
from helpers.triton_probe import (
    TIMEOUT,
    Observation,
    answer,
    called,
    case_list,
    client,
    client_infer,
    counts_of,
    ids_input,
    ids_of,
    infer_body,
    infer_raw,
    model_stats,
    raw,
    rejection,
)

CASES, case = case_list()


# ---- unknown names, methods and routes ------------------------------------------------------------------------
@case("infer: unknown model")
def _(t):
    with client(t) as c:
        how = called(c.infer, "nope", [ids_input(ids_of())])
    return {"client": how, **rejection(infer_raw(Target(t.kind, t.url, t.metrics_url, "nope"),
                                                  infer_body(ids_of())))}


@case("infer: unknown version")
def _(t):
    with client(t) as c:
        how = called(c.infer, t.model, [ids_input(ids_of())], model_version="3")
    return {"client": how, **rejection(raw(t, "POST", f"/v2/models/{t.model}/versions/3/infer",
                                           json=infer_body(ids_of())))}


@case("model metadata: unknown model")
def _(t):
    with client(t) as c:
        return {"client": called(c.get_model_metadata, "nope"), **rejection(raw(t, "GET", "/v2/models/nope"))}


@case("model ready: unknown model")
def _(t):
    with client(t) as c:
        ready = c.is_model_ready("nope")
    return {"client": ready, **rejection(raw(t, "GET", "/v2/models/nope/ready"))}


@case("statistics: unknown model")
def _(t):
    with client(t) as c:
        return {"client": called(c.get_inference_statistics, "nope"),
                **rejection(raw(t, "GET", "/v2/models/nope/stats"))}


@case("wrong method: GET on infer")
def _(t):
    return {"status": raw(t, "GET", f"/v2/models/{t.model}/infer").status_code}


@case("wrong method: POST on health")
def _(t):
    return {"status": raw(t, "POST", "/v2/health/live").status_code}


@case("unknown route")
def _(t):
    return {"status": raw(t, "GET", "/v2/nope/route").status_code}


# ---- statistics ---------------------------------------------------------------------------------------------
@case("statistics: one model")
def _(t):
    client_infer(t)
    return {"body": shape(model_stats(t))}


@case("statistics: every model")
def _(t):
    r = raw(t, "GET", "/v2/models/stats")
    return {**answer(r), "models": len(r.json()["model_stats"])}


@case("statistics after rejected requests")
def _(t):
    before = model_stats(t)
    bad = infer_body(ids_of())
    bad["inputs"][0]["datatype"] = "INT32"
    statuses = {infer_raw(t, bad).status_code for _ in range(3)}
    client_infer(t)  # one that runs
    after = model_stats(t)

    def delta(*path):
        a, b = after, before
        for p in path:
            a, b = a[p], b[p]
        return a - b

    return {"rejected with": tuple(sorted(statuses)), "success count": delta("inference_stats", "success", "count"),
            "fail count": delta("inference_stats", "fail", "count"), "inference_count": delta("inference_count"),
            "execution_count": delta("execution_count")}


@case("statistics after a model error (an id out of range)")
def _(t):
    before = model_stats(t)["inference_stats"]
    status = infer_raw(t, infer_body(np.full((2, TOPK), EXPERTS, np.int64))).status_code
    after = model_stats(t)["inference_stats"]
    return {"infer": status, **{f"{k} count": int(after[k]["count"]) - int(before[k]["count"])
                                for k in ("success", "fail")}}


# ---- model repository ---------------------------------------------------------------------------------------
@case("repository index")
def _(t):
    with client(t) as c:
        index = c.get_model_repository_index()
    return {"body": shape(index), "models": tuple((e["name"] == t.model, e.get("state")) for e in index)}


def _settled_state(c, model: str) -> tuple:
    """The model's states in the repository index once no unload is under way (Triton unloads in the
    background: UNLOADING first)."""
    deadline = time.monotonic() + 30
    while True:
        states = tuple(e.get("state") for e in c.get_model_repository_index() if e["name"] == model)
        if "UNLOADING" not in states or time.monotonic() > deadline:
            return states
        time.sleep(0.05)


@case("repository: unload, then load")
def _(t):
    ids = ids_of(6)
    with client(t) as c:
        steps = {"unload": called(c.unload_model, t.model)}
        steps["ready after unload"] = c.is_model_ready(t.model)
        steps["infer after unload"] = called(c.infer, t.model, [ids_input(ids)])
        steps["index state after unload"] = _settled_state(c, t.model)
        steps["load"] = called(c.load_model, t.model)
        steps["ready after load"] = c.is_model_ready(t.model)
        r = c.infer(t.model, [ids_input(ids)])
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
    return steps


@case("repository: unload unknown model")
def _(t):
    with client(t) as c:
        how = called(c.unload_model, "nope")
    return {"client": how, **rejection(raw(t, "POST", "/v2/repository/models/nope/unload"))}


@case("repository: load unknown model")
def _(t):
    with client(t) as c:
        how = called(c.load_model, "nope")
    return {"client": how, **rejection(raw(t, "POST", "/v2/repository/models/nope/load"))}


# ---- system shared memory -----------------------------------------------------------------------------------
@case("system shared memory: register, status, infer, unregister")
def _(t):
    ids = ids_of(7)
    tag = uuid.uuid4().hex[:10]
    ins, outs = f"in_{tag}", f"out_{tag}"
    in_region = shm.create_shared_memory_region(ins, f"/sf_{ins}", ids.nbytes)
    out_region = shm.create_shared_memory_region(outs, f"/sf_{outs}", EXPERTS * 8)
    seen: Observation = {}
    try:
        shm.set_shared_memory_region(in_region, [ids])
        with client(t) as c:
            seen["register"] = (called(c.register_system_shared_memory, ins, f"/sf_{ins}", ids.nbytes),
                                called(c.register_system_shared_memory, outs, f"/sf_{outs}", EXPERTS * 8))
            seen["status"] = shape(c.get_system_shared_memory_status(ins))
            i = httpclient.InferInput("topk_ids", list(ids.shape), "INT64")
            i.set_shared_memory(ins, ids.nbytes)
            o = httpclient.InferRequestedOutput("counts", binary_data=True)
            o.set_shared_memory(outs, EXPERTS * 8)
            r = c.infer(t.model, [i], outputs=[o])
            seen["output"] = shape(r.get_output("counts"))
            got = shm.get_contents_as_numpy(out_region, np.int64, [EXPERTS])
            np.testing.assert_array_equal(got, counts_of(ids), err_msg=f"{t.kind}: counts in shared memory")
            seen["counts"] = "NumPy's"
            seen["unregister"] = (called(c.unregister_system_shared_memory, ins),
                                  called(c.unregister_system_shared_memory, outs))
            seen["status after"] = len(c.get_system_shared_memory_status())
    finally:
        shm.destroy_shared_memory_region(in_region)
        shm.destroy_shared_memory_region(out_region)
    return seen


@case("system shared memory: register a key that does not exist")
def _(t):
    with client(t) as c:
        how = called(c.register_system_shared_memory, "nokey", f"/sf_{uuid.uuid4().hex[:12]}", 64)
    return {"client": how, **rejection(raw(t, "POST", "/v2/systemsharedmemory/region/nokey/register",
                                           json={"key": f"/sf_{uuid.uuid4().hex[:12]}", "byte_size": 64}))}


@case("system shared memory: register without a key")
def _(t):
    return rejection(raw(t, "POST", "/v2/systemsharedmemory/region/nokey/register", json={"byte_size": 64}))


@case("system shared memory: unregister unknown name")
def _(t):
    with client(t) as c:
        how = called(c.unregister_system_shared_memory, "nope")
    return {"client": how, **rejection(raw(t, "POST", "/v2/systemsharedmemory/region/nope/unregister"))}


@case("system shared memory: status of unknown name")
def _(t):
    with client(t) as c:
        how = called(c.get_system_shared_memory_status, "nope")
    return {"client": how, **rejection(raw(t, "GET", "/v2/systemsharedmemory/region/nope/status"))}


# ---- trace and log settings ---------------------------------------------------------------------------------
@case("trace settings")
def _(t):
    with client(t) as c:
        return {"server": shape(c.get_trace_settings()), "model": shape(c.get_trace_settings(t.model))}


@case("trace settings: update")
def _(t):
    with client(t) as c:
        return {"update": called(c.update_trace_settings, settings={"trace_level": ["OFF"]}),
                "update model": called(c.update_trace_settings, t.model, settings={"trace_level": ["OFF"]}),
                "level after": tuple(c.get_trace_settings()["trace_level"])}


@case("trace and log settings: an unknown key, an unknown model")
def _(t):
    return {"trace, unknown key": raw(t, "POST", "/v2/trace/setting", json={"no_such_setting": ["1"]}).status_code,
            "trace, unknown model": raw(t, "GET", "/v2/models/nope/trace/setting").status_code,
            "log, unknown key": raw(t, "POST", "/v2/logging", json={"no_such_setting": True}).status_code}


@case("log settings")
def _(t):
    with client(t) as c:
        before = c.get_log_settings()
        how = called(c.update_log_settings, {"log_verbose_level": before.get("log_verbose_level", 0)})
        return {"body": shape(before), "update": how}


# ---- metrics ------------------------------------------------------------------------------------------------
TRITON_FAMILIES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                   "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us")


LABEL = re.compile(r'(\w+)="')


@case("GET /metrics on the HTTP port")
def _(t):
    return {"status": raw(t, "GET", "/metrics").status_code}


@case("GET /metrics on the metrics port")
def _(t):
    r = httpx.get(t.metrics_url + "/metrics", timeout=TIMEOUT)
    return {"status": r.status_code, "content type": r.headers.get("content-type", "").split(";")[0]}


@case("metrics: Triton's inference families")
def _(t):
    """The families Triton dashboards read: their types, and the sample names and label names for this model."""
    client_infer(t)
    text = httpx.get(t.metrics_url + "/metrics", timeout=TIMEOUT).text
    types = dict(ln.split()[2:4] for ln in text.splitlines() if ln.startswith("# TYPE "))
    samples = set()
    for ln in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s", ln)
        if m and m.group(1).startswith(TRITON_FAMILIES) and f'model="{t.model}"' in (m.group(2) or ""):
            labels = ",".join(sorted(LABEL.findall(m.group(2))))
            samples.add(f"{m.group(1)}{{{labels}}}")
    return {"families": frozenset(f"{f}: {types[f]}" for f in TRITON_FAMILIES if f in types),
            "samples": frozenset(samples)}
