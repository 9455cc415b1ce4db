"""`Segment`: shared memory without a name (memfd), mapped here, whose descriptor another process of
the server gets (the JSON codec's helper, server/codec.py). With no name, no client can register
one as a shared-memory region (one once read another client's request body that way), and none
outlives the processes holding it: nothing is left in /dev/shm after a SIGKILL."""

from __future__ import annotations

import mmap
import os
import secrets
from contextlib import suppress

from .regions import SERVER_PREFIX


def anonymous_fd() -> int:
    """A descriptor of new, empty shared memory that no name leads to."""
    try:
        return os.memfd_create("segfuse-codec", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memfd (an old kernel or libc): a name nobody can guess, gone at once
        import _posixshmem

        name = f"/{SERVER_PREFIX}{secrets.token_hex(16)}"  # a prefix region keys may not use (server/regions.py)
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink(name)
        return fd


class Segment:
    """A mapping of shared memory and the descriptor that other process gets; `close` releases both."""

    def __init__(self, fd: int):
        """Takes `fd` over (closed by `close`, or here on failure); the size is the memory's own."""
        try:
            self.size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.buf = memoryview(self._map)

    @classmethod
    def new(cls, size: int) -> Segment:
        fd = anonymous_fd()
        try:
            os.ftruncate(fd, max(size, 1))
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def close(self) -> None:
        with suppress(BufferError):  # a NumPy view still exists: the mapping goes with the last one
            self.buf.release()
            self._map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def write_all(fd: int, data) -> None:
    """`fd`'s memory becomes exactly `data` (a bytes-like object)."""
    view = memoryview(data).cast("B")
    os.ftruncate(fd, max(len(view), 1))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], done)
