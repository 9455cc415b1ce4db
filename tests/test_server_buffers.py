"""BufferStore pins: reader/writer semantics, writer preference, no deadlock, byte accounting."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers.waiting import scaled
from segfuse.compiler.dtypes import DType
from segfuse.server.buffers import BufferStore
from segfuse.server.errors import ApiError

pytestmark = pytest.mark.anyio


def store(**kw) -> BufferStore:
    return BufferStore(kw.get("per", 1 << 20), kw.get("total", 1 << 20))


async def commit(s: BufferStore, name: str, n: int = 8) -> None:
    async with s.pin(writes=[name]):
        s.commit(name, np.zeros(n // 8, np.int64), DType.int64, (n // 8,), n)


async def test_readers_share_writers_exclude():
    s = store()
    await commit(s, "x")
    order = []
    release = asyncio.Event()

    async def reader(tag):
        async with s.pin(reads=["x"]):
            order.append(f"{tag} in")
            await release.wait()
            order.append(f"{tag} out")

    async def writer():
        async with s.pin(writes=["x"]):
            order.append("w")

    r1, r2 = asyncio.create_task(reader("r1")), asyncio.create_task(reader("r2"))
    await asyncio.sleep(0.01)
    assert s.pinned("x") == (2, False)
    w = asyncio.create_task(writer())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(reader("r3"))  # arrives after the waiting writer: waits behind it
    await asyncio.sleep(0.01)
    assert order == ["r1 in", "r2 in"]
    release.set()
    await asyncio.gather(r1, r2, w, late)
    assert order.index("w") > order.index("r2 out") and order.index("r3 in") > order.index("w")
    assert s.pinned("x") == (0, False)


async def test_crossed_read_write_pins_do_not_deadlock():
    """A writes x and reads y while B writes y and reads x, both waiting behind a holder."""
    s = store()
    await commit(s, "x")
    await commit(s, "y")
    hold = asyncio.Event()
    done = []

    async def holder():
        async with s.pin(reads=["x", "y"]):
            await hold.wait()

    async def a():
        async with s.pin(reads=["y"], writes=["x"]):
            done.append("a")

    async def b():
        async with s.pin(reads=["x"], writes=["y"]):
            done.append("b")

    h = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    ta, tb = asyncio.create_task(a()), asyncio.create_task(b())
    await asyncio.sleep(0.01)
    hold.set()
    await asyncio.wait_for(asyncio.gather(h, ta, tb), scaled(5))
    assert sorted(done) == ["a", "b"]


async def test_cancelled_waiter_leaves_no_trace():
    s = store()
    await commit(s, "x")
    hold = asyncio.Event()

    async def holder():
        async with s.pin(reads=["x"]):
            await hold.wait()

    h = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    w = asyncio.create_task(commit(s, "x"))
    await asyncio.sleep(0.01)
    w.cancel()
    hold.set()
    await h
    async with s.pin(reads=["x"]):  # not blocked by the cancelled writer
        pass
    assert s.pinned("x") == (0, False)


async def test_commit_needs_a_write_pin_and_limits_count_reservations():
    s = store(per=64, total=128)
    with pytest.raises(AssertionError):
        s.commit("x", np.zeros(1), DType.float64, (1,), 8)
    with pytest.raises(ApiError) as e:
        s.check_sizes({"x": 72})
    assert e.value.status == 413
    await commit(s, "a", 64)
    async with s.reserve({"b": 64}):
        with pytest.raises(ApiError):
            s.check_sizes({"c": 8})  # 64 used + 64 reserved
    s.check_sizes({"c": 64})
    assert s.used_bytes == 64 and s.reserved_bytes == 0
