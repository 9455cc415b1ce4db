"""Everything the sync and async clients share: URLs, request building, response decoding.

Each public client method is a *call*: a generator that yields `httpx.Request`s and receives
the `httpx.Response` for each, then returns the method's result. It does no I/O itself, so the
same call runs under `Client` (which sends with `httpx.Client.send`) and `AsyncClient` (which
awaits `httpx.AsyncClient.send`). Most calls send one request; `plan` or `run` of a graph file
not registered through this client yet sends two (the registration is remembered: `GraphPaths`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Generator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from ._arrays import as_numpy_dtype, from_raw, kserve_datatype, load_npy, numpy_dtype, to_host
from ._errors import ClientError
from ._types import Buffer, FusionRef, Region, RunResult
from .sharding import NAMESPACE_HEADER

Call = Generator[httpx.Request, httpx.Response, Any]

NPY = "application/x-npy"
OCTET = "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"  # the binary tensor data extension
PROBE = "segfuse_no_status_retry"  # a request extension: its 429/503 is the answer (client/_retry.py)


def normalize_url(url: str) -> str:
    """'localhost:8000' (Triton style) or 'http://localhost:8000/base' -> a base URL with scheme."""
    url = url.strip()
    if not url:
        raise ValueError("empty server URL")
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def graph_dict(fusion) -> dict:
    """The JSON graph of a FusionDefinition, a dict, a JSON string or a path to a .json file, with
    NaN and infinite literals written as the format writes them ("NaN", "Infinity", "-Infinity")."""
    return _json_literals(_graph(fusion))


def _json_literals(doc):
    """`doc` with every NaN or infinite float as its string (JSON has no number for them)."""
    if isinstance(doc, Mapping):
        return {k: _json_literals(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_json_literals(v) for v in doc]
    if isinstance(doc, float) and not math.isfinite(doc):
        return "NaN" if doc != doc else ("Infinity" if doc > 0 else "-Infinity")
    return doc


def _graph(fusion) -> dict:
    if hasattr(fusion, "to_dict"):
        return fusion.to_dict()
    if isinstance(fusion, Mapping):
        return dict(fusion)
    if isinstance(fusion, (str, os.PathLike)):
        text = str(fusion)
        if text.lstrip().startswith("{"):
            return json.loads(text)
        try:
            with open(fusion) as f:
                return json.load(f)
        except OSError as e:
            raise ClientError(f"cannot read graph file {fusion}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ClientError(f"graph file {fusion} is not valid JSON: {e}") from None
    raise TypeError(f"a fusion is a FusionDefinition, a dict or a path to a JSON file, "
                    f"not {type(fusion).__name__}")


def is_graph_path(fusion) -> bool:
    """A path (str or os.PathLike) to a graph JSON file, as opposed to a name or inline JSON."""
    if isinstance(fusion, os.PathLike):
        return True
    return isinstance(fusion, str) and not fusion.lstrip().startswith("{") and not is_registered_name(fusion)


class GraphPaths:
    """Graph files already registered through this client: absolute path -> (the file's stat
    stamp, FusionRef). A run of a path then goes by the fusion's id, without sending the graph
    again; a changed file (mtime, size or inode) is registered again, and so is one the server
    no longer knows (a 404 for its id)."""

    LIMIT = 1024

    def __init__(self):
        self._refs: dict[str, tuple[tuple, FusionRef]] = {}

    @staticmethod
    def stamp(path) -> tuple[str, tuple | None]:
        key = os.path.abspath(os.fspath(path))
        try:
            st = os.stat(key)
        except OSError:
            return key, None  # reading it will say why
        return key, (st.st_mtime_ns, st.st_size, st.st_ino)

    def get(self, path) -> FusionRef | None:
        key, stamp = self.stamp(path)
        entry = self._refs.get(key)
        return entry[1] if entry is not None and stamp is not None and entry[0] == stamp else None

    def put(self, key: str, stamp: tuple | None, ref: FusionRef) -> None:
        if stamp is None:
            return
        if len(self._refs) >= self.LIMIT:
            self._refs.pop(next(iter(self._refs)))
        self._refs[key] = (stamp, ref)

    def forget(self, path) -> None:
        self._refs.pop(self.stamp(path)[0], None)


def is_registered_name(fusion) -> bool:
    """A str that names a fusion on the server rather than a graph file or inline JSON."""
    return (isinstance(fusion, str) and not fusion.lstrip().startswith("{")
            and not fusion.endswith(".json") and not os.path.exists(fusion))


def format_shapes(shapes: Mapping[str, int] | str) -> str:
    """{'T': 4096, 'K': 8} -> 'T=4096,K=8' (the plan endpoint's query syntax)."""
    if isinstance(shapes, str):
        return shapes
    return ",".join(f"{k}={int(v)}" for k, v in shapes.items())


# ---- decoding ---------------------------------------------------------------------------------
def _decode(response: httpx.Response) -> httpx.Response:
    """The response if it succeeded; else a ClientError built from the server's error body."""
    if response.is_success:
        return response
    message, details = response.reason_phrase or "error", []
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
        if response.text.strip():
            message = response.text.strip()[:500]
    if isinstance(body, dict):
        message = str(body.get("error") or body.get("detail") or message)
        if isinstance(body.get("details"), list):
            details = body["details"]
    raise ClientError(message, status=response.status_code, details=details, url=str(response.request.url))


def _json(response: httpx.Response):
    return _decode(response).json()


def transport_error(e: httpx.TransportError, request: httpx.Request) -> ClientError:
    """A connection-level failure, with the URL so the user sees where it tried to go."""
    kind = "timed out talking to" if isinstance(e, httpx.TimeoutException) else "cannot reach"
    return ClientError(f"{kind} the segfuse server at {request.url}: {str(e) or type(e).__name__}",
                        url=str(request.url))


def _split_binary(response: httpx.Response) -> tuple[dict, bytes]:
    """(JSON header, trailing binary section) of a possibly binary-framed response."""
    content = response.content
    n = response.headers.get(HEADER_LENGTH)
    if n is None:
        return json.loads(content), b""
    n = int(n)
    return json.loads(content[:n]), content[n:]


def decode_infer(response: httpx.Response) -> RunResult:
    body, blob = _split_binary(_decode(response))
    arrays, buffers, regions, offset = {}, {}, {}, 0
    for out in body.get("outputs", []):
        params = out.get("parameters") or {}
        name = out["name"]
        if "shared_memory_region" in params:  # written to shared memory: no data here
            regions[name] = params["shared_memory_region"]
            continue
        if "buffer" in params and out.get("data") is None and "binary_data_size" not in params:
            buffers[name] = params["buffer"]
            continue
        dtype, shape = numpy_dtype(out["datatype"]), tuple(out.get("shape", ()))
        if "binary_data_size" in params:
            size = int(params["binary_data_size"])
            arr = from_raw(blob[offset:offset + size], dtype, shape)
            offset += size
        else:
            arr = np.asarray(out.get("data", []), dtype=np.float64 if dtype.kind == "f" else None
                             ).astype(dtype).reshape(shape)
        arrays[name] = arr
        if "buffer" in params:
            buffers[name] = params["buffer"]
    params = body.get("parameters") or {}
    return RunResult(model_name=body.get("model_name", ""), id=body.get("id"),
                     fusion_id=params.get("fusion_id", ""), outputs=arrays, buffers=buffers,
                     timings_us={k: float(v) for k, v in (params.get("timings_us") or {}).items()},
                     cache_hits=int(params.get("cache_hits", 0)),
                     cache_misses=int(params.get("cache_misses", 0)), parameters=params, regions=regions)


def decode_array(response: httpx.Response) -> np.ndarray:
    """A buffer from GET /v2/buffers/{name}: raw bytes with dtype/shape headers, or a .npy file."""
    dtype, shape = response.headers.get("X-Segfuse-Dtype"), response.headers.get("X-Segfuse-Shape")
    if response.headers.get("Content-Type", "").startswith(OCTET) and dtype is not None and shape is not None:
        return from_raw(response.content, numpy_dtype(dtype), tuple(int(d) for d in shape.split(",") if d.strip()))
    return load_npy(response.content)


def decode_fusion_ref(response: httpx.Response) -> FusionRef:
    body = _json(response)
    return FusionRef(id=body["id"], name=body.get("name", ""), info=body)


# ---- requests -----------------------------------------------------------------------------
class _RequestBuilder:
    """Makes the httpx.Request of every endpoint; knows the URL layout and the wire formats."""

    def __init__(self, base_url: str, token: str | None = None, namespace: str | None = None):
        self.base_url = normalize_url(base_url)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        if namespace is not None:  # read by the scale-out router and shards (segfuse.scaleout)
            self.headers[NAMESPACE_HEADER] = namespace

    def request(self, method: str, path: str, **kwargs) -> httpx.Request:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.Request(method, self.base_url + path, headers=headers, **kwargs)

    # health and metadata
    def get(self, path: str, **kwargs) -> httpx.Request:
        return self.request("GET", path, **kwargs)

    # buffers
    def put_buffer(self, name: str, array) -> httpx.Request:
        host = to_host(array)
        # Raw bytes + dtype/shape query: no .npy header to parse, and bfloat16 survives (NumPy
        # cannot describe ml_dtypes' bfloat16 in a .npy header).
        return self.request("PUT", f"/v2/buffers/{_seg(name)}", content=host.tobytes(),
                            params={"dtype": _datatype(host, f"buffer '{name}'"),
                                    "shape": ",".join(str(d) for d in host.shape)},
                            headers={"Content-Type": OCTET})

    def infer(self, fusion, inputs: Mapping[str, Any], outputs) -> httpx.Request:
        """POST /v2/models/{name}/infer for a registered fusion, else POST /v2/execute inline."""
        body, blobs = infer_body(inputs, outputs)
        if isinstance(fusion, FusionRef) or is_registered_name(fusion):
            ref = fusion.id if isinstance(fusion, FusionRef) else fusion
            path = f"/v2/models/{_seg(ref)}/infer"
        else:
            body["graph"] = graph_dict(fusion)
            path = "/v2/execute"
        header = json.dumps(body, separators=(",", ":")).encode()
        if not blobs:
            return self.request("POST", path, content=header, headers={"Content-Type": "application/json"})
        return self.request("POST", path, content=b"".join([header, *blobs]),
                            headers={"Content-Type": OCTET, HEADER_LENGTH: str(len(header))})


def infer_body(inputs: Mapping[str, Any], outputs) -> tuple[dict, list[bytes]]:
    """The KServe v2 request JSON and the binary section (arrays in input order)."""
    if not isinstance(inputs, Mapping):
        raise TypeError("inputs is a dict of name -> array or Buffer")
    body_inputs, blobs = [], []
    for name, value in inputs.items():
        if isinstance(value, Buffer):
            body_inputs.append({"name": name, "parameters": {"buffer": value.name}})
            continue
        if isinstance(value, Region):
            body_inputs.append(_region_input(name, value))
            continue
        host = to_host(value)
        raw = host.tobytes()
        body_inputs.append({"name": name, "shape": list(host.shape), "datatype": _datatype(host, f"input '{name}'"),
                            "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    body: dict = {"inputs": body_inputs}
    if outputs is not None:
        body["outputs"] = [_output_entry(name, dest) for name, dest in _output_items(outputs)]
    else:
        # Every output, returned as binary (KServe: omitted outputs means all of them).
        body["parameters"] = {"binary_data_output": True}
    return body, blobs


def _datatype(host: np.ndarray, what: str) -> str:
    """The KServe name of an array's dtype; checked here so the user learns which array is wrong."""
    try:
        return kserve_datatype(host.dtype)
    except ValueError as e:
        raise ClientError(f"{what}: {e}") from None


def _output_items(outputs) -> list[tuple[str, Any]]:
    if isinstance(outputs, str):
        return [(outputs, None)]
    if isinstance(outputs, Mapping):
        return list(outputs.items())
    if isinstance(outputs, Sequence):
        return [(name, None) for name in outputs]
    raise TypeError("outputs is a list of names or a dict of name -> Buffer (or None to return it)")


def _region_params(region: Region) -> dict:
    return {"shared_memory_region": region.name, "shared_memory_byte_size": int(region.byte_size),
            "shared_memory_offset": int(region.offset)}


def _region_input(name: str, region: Region) -> dict:
    """An input read from a region: Triton's parameters, with the tensor's datatype and shape."""
    if region.dtype is None or region.shape is None:
        raise ClientError(f"input '{name}': Region('{region.name}') needs a dtype and a shape; "
                           "use region.tensor(dtype, shape)")
    host_dtype = as_numpy_dtype(region.dtype)
    byte_size = region.byte_size if region.byte_size is not None else \
        int(np.prod(region.shape, dtype=np.int64)) * host_dtype.itemsize
    return {"name": name, "shape": list(region.shape), "datatype": kserve_datatype(host_dtype),
            "parameters": _region_params(Region(region.name, region.offset, byte_size))}


def _output_entry(name: str, dest) -> dict:
    if dest is None or dest is True:
        return {"name": name, "parameters": {"binary_data": True}}
    if isinstance(dest, Region):
        if dest.byte_size is None:
            raise ClientError(f"output '{name}': Region('{dest.name}') needs byte_size, the room the "
                               "output may take in it")
        return {"name": name, "parameters": _region_params(dest)}
    if isinstance(dest, str):
        dest = Buffer(dest)
    if not isinstance(dest, Buffer):
        raise TypeError(f"output '{name}': a destination is a Buffer, a buffer name, a Region or None")
    params: dict = {"buffer": dest.name}
    if dest.overwrite:
        params["overwrite"] = True
    return {"name": name, "parameters": params}


def _seg(name: str) -> str:
    """One URL path segment."""
    return quote(str(name), safe="")


# ---- calls ----------------------------------------------------------------------------------
class _Calls:
    """The client's methods as I/O-free generators (see the module docstring)."""

    def __init__(self, builder: _RequestBuilder):
        self.build = builder
        self.paths = GraphPaths()

    def is_live(self) -> Call:
        response = yield self.build.get("/v2/health/live", extensions={PROBE: True})
        return response.status_code == 200

    def is_ready(self) -> Call:
        response = yield self.build.get("/v2/health/ready", extensions={PROBE: True})
        return response.status_code == 200

    def metadata(self) -> Call:
        return _json((yield self.build.get("/v2")))

    def put(self, name: str, array) -> Call:
        return _json((yield self.build.put_buffer(name, array)))

    def get(self, name: str) -> Call:
        # Raw bytes, typed by the X-Segfuse-Dtype/-Shape headers: bfloat16 has no .npy description.
        response = _decode((yield self.build.get(f"/v2/buffers/{_seg(name)}", headers={"Accept": f"{OCTET}, {NPY};q=0.5"})))
        return decode_array(response)

    def delete(self, name: str) -> Call:
        _decode((yield self.build.request("DELETE", f"/v2/buffers/{_seg(name)}")))

    def buffers(self) -> Call:
        body = _json((yield self.build.get("/v2/buffers")))
        return body.get("buffers", body) if isinstance(body, dict) else body

    def register(self, fusion, replace: bool = False) -> Call:
        params = {"replace": "true"} if replace else {}
        key, stamp = self.paths.stamp(fusion) if is_graph_path(fusion) else (None, None)  # before reading
        response = yield self.build.request("POST", "/v2/fusions", json=graph_dict(fusion), params=params)
        ref = decode_fusion_ref(response)
        if key is not None:
            self.paths.put(key, stamp, ref)
        return ref

    def _by_path(self, path, request_for) -> Call:
        """The response to `request_for(ref)`, ref being the registered fusion of a graph file:
        remembered (GraphPaths), else registered now; registered again after a 404 for it
        (unregistered since, or the server restarted)."""
        cached = self.paths.get(path)
        response = yield request_for(cached or (yield from self.register(path)))
        if response.status_code == 404 and cached is not None:
            self.paths.forget(path)
            response = yield request_for((yield from self.register(path)))
        return response

    def fusions(self) -> Call:
        body = _json((yield self.build.get("/v2/fusions")))
        return body.get("fusions", body) if isinstance(body, dict) else body

    def fusion(self, ref) -> Call:
        return _json((yield self.build.get(f"/v2/fusions/{_seg(_ref_id(ref))}")))

    def unregister(self, ref) -> Call:
        _decode((yield self.build.request("DELETE", f"/v2/fusions/{_seg(_ref_id(ref))}")))

    def plan(self, fusion, shapes) -> Call:
        def request_for(ref) -> httpx.Request:
            return self.build.get(f"/v2/fusions/{_seg(_ref_id(ref))}/plan", params={"shape": format_shapes(shapes)})

        if isinstance(fusion, FusionRef) or is_registered_name(fusion):
            return _json((yield request_for(fusion)))
        if is_graph_path(fusion):
            return _json((yield from self._by_path(fusion, request_for)))
        return _json((yield request_for((yield from self.register(fusion)))))

    def run(self, fusion, inputs: Mapping[str, Any] | None = None, outputs=None) -> Call:
        def request_for(ref) -> httpx.Request:
            return self.build.infer(ref, inputs or {}, outputs)

        if is_graph_path(fusion):  # registered once, then run by id (no graph sent, none validated)
            return decode_infer((yield from self._by_path(fusion, request_for)))
        return decode_infer((yield request_for(fusion)))


def _ref_id(ref) -> str:
    return ref.id if isinstance(ref, FusionRef) else str(ref)
