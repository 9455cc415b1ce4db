import pytest


def _gpu_ok() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU = _gpu_ok()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not GPU:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and CuPy"))


@pytest.fixture
def spin():
    """`spin(ms)` holds the legacy default stream (which the runtime's blocking streams wait for)
    for `ms` milliseconds: work launched meanwhile is queued, not run."""
    import cupy as cp
    import numpy as np

    k = cp.RawKernel('extern "C" __global__ void sf_test_spin(unsigned long long ns) { unsigned long long t0, t;'
                     ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
                     ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }',
                     "sf_test_spin")

    def hold(ms: float):
        k((1,), (1,), (np.uint64(int(ms * 1e6)),), stream=cp.cuda.Stream.null)

    return hold
