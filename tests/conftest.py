"""Shared fixtures."""

from __future__ import annotations

# ---- server fixtures (tests/test_server_*.py) ----------------------------------------------
import contextlib
import copy
import threading
import time

import pytest

MOE_PROBLEM_SIZES = {
    "format": "segfuse.fusion/1", "name": "moe_problem_sizes",
    "inputs": [{"name": "topk_ids", "dtype": "int64", "shape": ["T", "K"]}],
    "ops": [{"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
            {"op": "full", "out": "zeros", "shape": [16], "value": 0, "dtype": "int64"},
            {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
            {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
    "outputs": ["counts"],
}

# dst updated in place (alias_of): the server must be given dst as a buffer, and updates it.
SCATTER_ADD_INPLACE = {
    "format": "segfuse.fusion/1", "name": "scatter_add",
    "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]},
               {"name": "index", "dtype": "int64", "shape": ["N"]},
               {"name": "src", "dtype": "float32", "shape": ["N"]}],
    "ops": [{"op": "scatter", "out": "dst_updated", "inputs": ["dst", "index", "src"], "dim": 0, "reduce": "add"}],
    "outputs": [{"name": "dst_updated", "alias_of": "dst"}],
}

ELEMENTWISE_CHAIN = {
    "format": "segfuse.fusion/1", "name": "elementwise_chain",
    "inputs": [{"name": n, "dtype": "float32", "shape": ["N"]} for n in "abc"],
    "ops": [{"op": "gt", "out": "positive", "inputs": ["a", 0]},
            {"op": "mul", "out": "ab", "inputs": ["a", "b"]},
            {"op": "add", "out": "ab_c", "inputs": ["ab", "c"]},
            {"op": "exp", "out": "exp_c", "inputs": ["c"]},
            {"op": "mul", "out": "half_exp_c", "inputs": ["exp_c", 0.5]},
            {"op": "where", "out": "out", "inputs": ["positive", "ab_c", "half_exp_c"]}],
    "outputs": ["out"],
}


@pytest.fixture
def moe_graph() -> dict:
    return copy.deepcopy(MOE_PROBLEM_SIZES)


@pytest.fixture
def scatter_add_graph() -> dict:
    return copy.deepcopy(SCATTER_ADD_INPLACE)


@pytest.fixture
def chain_graph() -> dict:
    return copy.deepcopy(ELEMENTWISE_CHAIN)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _cupy_ready() -> bool:
    from segfuse.server.backend import cupy_visible

    return cupy_visible()


@pytest.fixture(scope="module", params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def server_backend(request) -> str:
    """The backend integration tests run on: numpy always, cupy where a GPU and CuPy are visible."""
    if request.param == "cupy" and not _cupy_ready():
        pytest.skip("no CuPy or no visible GPU")
    return request.param


def _settings(**kw):
    from segfuse.server.settings import Settings

    kw.setdefault("backend", "numpy")
    return Settings(**kw)


def _skip_if_not_ready(app) -> None:
    rt = app.state.runtime
    if not rt.ready:
        if rt.settings.backend == "cupy":
            pytest.skip(f"cupy backend not available: {rt.init_error}")
        raise AssertionError(f"server did not become ready: {rt.init_error}")


@pytest.fixture
def asgi_server():
    """`async with asgi_server(**settings) as client`: the app in-process (lifespan run), an
    httpx.AsyncClient on it; client.app is the app."""
    import httpx
    from asgi_lifespan import LifespanManager
    from segfuse.server import create_app
    from segfuse.server.app import wait_ready

    @contextlib.asynccontextmanager
    async def serve(headers: dict | None = None, **settings):
        app = create_app(_settings(**settings))
        async with LifespanManager(app, startup_timeout=60) as manager:
            await wait_ready(app)
            _skip_if_not_ready(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                         base_url="http://segfuse.test", headers=headers or {},
                                         timeout=30) as client:
                client.app = app
                yield client

    return serve


class LiveServer:
    """A real uvicorn server on a free loopback port, in a thread of the test process."""

    def __init__(self, **settings):
        import uvicorn
        from segfuse.server import create_app

        self.app = create_app(_settings(**settings))
        # Port 0: uvicorn binds a free loopback port itself (a socket handed in from outside
        # costs ~40 ms per request here: Nagle and delayed ACKs).
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def start(self) -> LiveServer:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.started:
                if not self.url:
                    port = self.server.servers[0].sockets[0].getsockname()[1]
                    self.url = f"http://127.0.0.1:{port}"
                try:
                    if httpx.get(self.url + "/v2/health/ready", timeout=5).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if self.app.state.runtime.init_error:
                    break
            time.sleep(0.02)
        self.stop()
        _skip_if_not_ready(self.app)
        raise AssertionError("uvicorn did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def runtime(self):
        return self.app.state.runtime


@pytest.fixture(scope="module")
def live_server(server_backend):
    """One uvicorn server per module and backend (starting one costs ~0.2 s)."""
    server = LiveServer(backend=server_backend, max_queued_runs=1024).start()
    yield server
    server.stop()


@pytest.fixture
def live_server_factory():
    """Start extra uvicorn servers with their own settings; all are stopped after the test."""
    started = []

    def start(**settings) -> LiveServer:
        s = LiveServer(**settings).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()



# ---- the compile check (tests/compile_check.py): every plan the session builds compiles --------
def pytest_addoption(parser):
    import compile_check

    compile_check.addoption(parser)


def pytest_configure(config):
    import compile_check

    compile_check.configure(config)
