"""Shared fixtures (the helpers they build on are in tests/helpers/)."""

from __future__ import annotations

import contextlib
import copy
import os
import uuid

import pytest
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES, SCATTER_ADD_INPLACE
from helpers.processes import server_process
from helpers.servers import LiveServer, settings, skip_if_not_ready
from helpers.waiting import scaled
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# No Hypothesis check that times anything: a loaded machine is slow, not wrong. Tests' own
# @settings start from this profile.
hypothesis_settings.register_profile("segfuse", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("segfuse")


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
    from segfuse.server.array_backends import cupy_visible

    return cupy_visible()


@pytest.fixture(scope="module", params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def server_backend(request) -> str:
    """The backend integration tests run on: numpy always, cupy where a GPU and CuPy are visible."""
    if request.param == "cupy" and not _cupy_ready():
        pytest.skip("no CuPy or no visible GPU")
    return request.param


@pytest.fixture
def asgi_server():
    """`async with asgi_server(**settings) as client`: the app in-process (lifespan run), an
    httpx.AsyncClient on it; client.app is the app."""
    import httpx
    from asgi_lifespan import LifespanManager
    from segfuse.server import create_app
    from segfuse.server.app import wait_ready

    @contextlib.asynccontextmanager
    async def serve(headers: dict | None = None, **kw):
        app = create_app(settings(**kw))
        async with LifespanManager(app, startup_timeout=scaled(120)) as manager:
            await wait_ready(app)
            skip_if_not_ready(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                         base_url="http://segfuse.test", headers=headers or {},
                                         timeout=scaled(60)) as client:
                client.app = app
                yield client

    return serve


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

    def start(**kw) -> LiveServer:
        s = LiveServer(**kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def emulated(monkeypatch):
    """(runtime, Array): a CupyRuntime whose launches run the generated kernels on the CUDA emulator."""
    from helpers.emulated import emulated_runtime

    return emulated_runtime(monkeypatch)


@pytest.fixture
def shm():
    """`shm(nbytes, fill=0, name=None)`: a new POSIX shared-memory object (closed and unlinked afterwards)."""
    from multiprocessing import shared_memory

    made = []

    def make(nbytes: int, fill: int = 0, name: str | None = None) -> shared_memory.SharedMemory:
        s = shared_memory.SharedMemory(name=name or f"sf_test_{uuid.uuid4().hex[:12]}", create=True, size=nbytes)
        s.buf[:nbytes] = bytes([fill]) * nbytes
        made.append(s)
        return s

    yield make
    for s in made:
        try:
            s.close()
        except BufferError:  # a test's NumPy view is still alive: the mapping goes with it
            pass
        s.unlink()


@pytest.fixture(scope="module")
def server():
    """A segfuse server process (NumPy backend) on a free loopback port, one per module; its URL."""
    with server_process() as url:
        yield url


# ---- the compile check (tests/compile_check.py): every plan the session builds compiles --------
def pytest_addoption(parser):
    import compile_check

    compile_check.addoption(parser)


def pytest_configure(config):
    import compile_check

    compile_check.configure(config)


# ---- pytest-timeout's hang guards stretch like every other wait (helpers/waiting.py) ------------
def _stretched_default_timeout(config) -> float | None:
    """The ini file's per-test timeout times SCALE; None where --timeout or PYTEST_TIMEOUT names one."""
    if getattr(config.option, "timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return None
    ini = config.getini("timeout")
    return scaled(float(ini)) if ini else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    default = _stretched_default_timeout(config)
    for item in items:
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args:
            item.add_marker(pytest.mark.timeout(scaled(marker.args[0])), append=False)
        elif marker is None and default:
            item.add_marker(pytest.mark.timeout(default))
