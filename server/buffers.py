"""`BufferStore`: named arrays that live where the backend computes (GPU for CuPy), with pins and
byte accounting.

Pins are reader/writer locks over names, taken all at once for a whole request (a run pins every
buffer it reads and writes), so no request holds some names while waiting for others: no
deadlock. A waiting writer (DELETE, PUT over an existing buffer, a run that writes) holds back
readers that arrive after it, so a stream of runs cannot starve a DELETE; readers that arrived
earlier are not held back, which keeps the oldest waiter always able to proceed.

All state lives on the event loop (asyncio primitives, no threads touch it); the arrays themselves
are read and written by worker threads only while pinned.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from segfuse.compiler.dtypes import DType

from .errors import too_large


@dataclass
class StoredBuffer:
    name: str
    array: Any  # numpy.ndarray or cupy.ndarray
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class _NameLock:
    readers: int = 0
    writer: bool = False
    waiting_writers: set[int] = field(default_factory=set)  # tickets

    @property
    def idle(self) -> bool:
        return not self.readers and not self.writer and not self.waiting_writers


class BufferStore:
    def __init__(self, max_buffer_bytes: int, max_total_bytes: int, device: str = "cpu",
                 on_change: Callable[[BufferStore], None] | None = None):
        self.max_buffer_bytes = max_buffer_bytes
        self.max_total_bytes = max_total_bytes
        self.device = device
        self._buffers: dict[str, StoredBuffer] = {}
        self._locks: dict[str, _NameLock] = {}
        self._waiters: list = []  # (ticket, reads, writes, future), oldest first
        self._tickets = itertools.count()
        self._reserved = 0
        self._used = 0  # bytes of all stored buffers
        self._on_change = on_change

    # ---- reading state ------------------------------------------------------------------
    def get(self, name: str) -> StoredBuffer | None:
        return self._buffers.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def all(self) -> list[StoredBuffer]:
        return [self._buffers[k] for k in sorted(self._buffers)]

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def pinned(self, name: str) -> tuple[int, bool]:
        """(readers, writer) holding `name` now; for tests and metrics."""
        lk = self._locks.get(name)
        return (lk.readers, lk.writer) if lk else (0, False)

    # ---- pins ---------------------------------------------------------------------------
    def try_pin(self, reads: Iterable[str] = (), writes: Iterable[str] = ()) -> tuple[frozenset, frozenset] | None:
        """Take the pins at once if nothing holds or waits for them (the common case: no await);
        None if the caller must wait (`acquire`)."""
        writes = frozenset(writes)
        reads = frozenset(reads) - writes
        if self._waiters or not self._can_take(reads, writes, next(self._tickets)):
            return None
        self._take(reads, writes)
        return reads, writes

    async def acquire(self, reads: Iterable[str] = (), writes: Iterable[str] = ()) -> tuple[frozenset, frozenset]:
        """Shared pins on `reads`, exclusive pins on `writes`; waits for conflicting holders.
        Give the result to `release` when done."""
        writes = frozenset(writes)
        reads = frozenset(reads) - writes
        ticket = next(self._tickets)
        if not self._waiters and self._can_take(reads, writes, ticket):
            self._take(reads, writes)
            return reads, writes
        for n in writes:
            self._lock(n).waiting_writers.add(ticket)
        waiter = (ticket, reads, writes, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter[3]
        except BaseException:
            if waiter[3].done() and not waiter[3].cancelled():
                self.release((reads, writes))  # granted as the caller was cancelled: give back
            else:
                self._drop_waiter(waiter)
            raise
        return reads, writes

    def release(self, pins: tuple[frozenset, frozenset]) -> None:
        reads, writes = pins
        for n in reads:
            self._locks[n].readers -= 1
        for n in writes:
            self._locks[n].writer = False
        for n in reads | writes:
            if self._locks[n].idle:
                del self._locks[n]
        if self._waiters:
            self._grant()

    @asynccontextmanager
    async def pin(self, reads: Iterable[str] = (), writes: Iterable[str] = ()):
        """Hold shared pins on `reads` and exclusive pins on `writes` for the body of the block."""
        pins = await self.acquire(reads, writes)
        try:
            yield
        finally:
            self.release(pins)

    def _take(self, reads: frozenset, writes: frozenset) -> None:
        for n in reads:
            self._lock(n).readers += 1
        for n in writes:
            self._lock(n).writer = True

    def _grant(self) -> None:
        """Wake, oldest first, every waiter whose pins are free now."""
        for waiter in list(self._waiters):
            ticket, reads, writes, fut = waiter
            if fut.done():  # cancelled
                self._drop_waiter(waiter, regrant=False)
                continue
            if self._can_take(reads, writes, ticket):
                self._drop_waiter(waiter, regrant=False)
                self._take(reads, writes)
                fut.set_result(None)

    def _drop_waiter(self, waiter, regrant: bool = True) -> None:
        ticket, _reads, writes, _fut = waiter
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        for n in writes:
            lk = self._locks.get(n)
            if lk is not None:
                lk.waiting_writers.discard(ticket)
                if lk.idle:
                    del self._locks[n]
        if regrant and self._waiters:
            self._grant()  # a reader held back by this writer may go now

    def _lock(self, name: str) -> _NameLock:
        lk = self._locks.get(name)
        if lk is None:
            lk = self._locks[name] = _NameLock()
        return lk

    def _can_take(self, reads: frozenset, writes: frozenset, ticket: int) -> bool:
        locks = self._locks
        for n in reads:
            lk = locks.get(n)
            if lk and (lk.writer or any(t < ticket for t in lk.waiting_writers)):
                return False
        for n in writes:
            lk = locks.get(n)
            if lk and (lk.writer or lk.readers or any(t < ticket for t in lk.waiting_writers)):
                return False
        return True

    # ---- bytes --------------------------------------------------------------------------
    def check_sizes(self, sizes: dict[str, int], loc_of: Callable[[str], list] = lambda n: []) -> None:
        """413 if a new buffer of these sizes could not be stored (before any work is done)."""
        for name, n in sizes.items():
            if n > self.max_buffer_bytes:
                raise too_large(f"buffer '{name}' would hold {n} bytes, over the limit of "
                                f"{self.max_buffer_bytes} bytes per buffer", loc_of(name))
        total = sum(sizes.values())
        if self.used_bytes + self._reserved + total > self.max_total_bytes:
            raise too_large(f"storing {total} more bytes would exceed the limit of {self.max_total_bytes} "
                            f"bytes for all buffers ({self.used_bytes} in use, {self._reserved} reserved "
                            "by runs in progress)", loc_of(next(iter(sizes), "")))

    def reserve_bytes(self, sizes: dict[str, int], loc_of: Callable[[str], list] = lambda n: []) -> int:
        """Check and hold `sizes` against the limits while new arrays are being made; returns the
        bytes to give to `unreserve`. The buffers they replace still count until the new ones are
        committed: both exist on the device in the meantime."""
        self.check_sizes(sizes, loc_of)
        total = sum(sizes.values())
        self._reserved += total
        return total

    def unreserve(self, total: int) -> None:
        self._reserved -= total

    @asynccontextmanager
    async def reserve(self, sizes: dict[str, int], loc_of: Callable[[str], list] = lambda n: []):
        total = self.reserve_bytes(sizes, loc_of)
        try:
            yield
        finally:
            self.unreserve(total)

    # ---- changing state (the caller holds a write pin on the name) -------------------------
    def commit(self, name: str, array: Any, dtype: DType, shape: tuple[int, ...], nbytes: int) -> bool:
        """Bind `array` to `name`; True if it was new."""
        self._assert_writer(name)
        old = self._buffers.get(name)
        self._buffers[name] = StoredBuffer(name, array, dtype, tuple(shape), nbytes)
        self._used += nbytes - (old.nbytes if old else 0)
        created = old is None
        self._changed()
        return created

    def remove(self, name: str) -> StoredBuffer | None:
        self._assert_writer(name)
        b = self._buffers.pop(name, None)
        if b is not None:
            self._used -= b.nbytes
        self._changed()
        return b

    def _assert_writer(self, name: str) -> None:
        lk = self._locks.get(name)
        if not (lk and lk.writer):
            raise AssertionError(f"buffer '{name}' changed without a write pin")

    def _changed(self) -> None:
        if self._on_change:
            self._on_change(self)
