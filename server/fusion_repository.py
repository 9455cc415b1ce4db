"""The fusion repository directory on disk (`--fusion-dir`): reading its graph files safely and
writing them atomically. The registry (server/fusions.py) decides what the files are; this module
only touches the directory, which whoever can write into it may have filled with anything.

- Reading: every entry is opened with O_NOFOLLOW|O_NONBLOCK (a symlink is refused, a FIFO cannot
  block the open) and checked with fstat; anything but a regular file is skipped with a warning,
  and a file over the size bound is skipped unread.
- Writing: the graph goes to a temporary file of an unguessable name in the directory, created
  with O_EXCL|O_NOFOLLOW (a planted file or symlink makes the create fail, it is never followed),
  fsynced, then renamed over <id>.json (rename replaces a planted entry, never writes through it),
  and the directory is fsynced. A crash leaves the old file or the new one, never half a graph.
- Every written file is newer (mtime) than the files it supersedes, so that after a crash between
  writing a replacement and removing the graph it replaces, the next start can tell which is current.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat

log = logging.getLogger("segfuse.server")

SUFFIX = ".json"
SUPERSEDED = ".superseded"  # appended to a file whose graph name a newer file holds (not loaded again)
_TMP = re.compile(r"^\.[0-9a-f]+\.[0-9a-f]{32}\.tmp$")  # this module's temporary files
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class GraphFile:
    """A regular *.json file of the directory, read."""

    def __init__(self, name: str, path: str, data: bytes, mtime_ns: int):
        self.name, self.path, self.data, self.mtime_ns = name, path, data, mtime_ns


class FusionRepository:
    def __init__(self, directory: str, max_file_bytes: int):
        self.directory = directory
        self.max_file_bytes = max_file_bytes

    def path(self, fusion_id: str) -> str:
        return os.path.join(self.directory, fusion_id + SUFFIX)  # ids are hex: a safe file name

    # ---- reading -------------------------------------------------------------------------------
    def scan(self) -> tuple[list[GraphFile], list[tuple[str, str]]]:
        """The directory's *.json regular files, in name order, and (name, why) for the *.json
        entries skipped. Removes temporary files an interrupted write left."""
        os.makedirs(self.directory, exist_ok=True)
        found, skipped = [], []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if _TMP.match(name):
                with contextlib.suppress(OSError):
                    os.remove(path)  # unlink never follows a symlink: at worst it removes a planted link
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                found.append(self._read(name, path))
            except OSError as e:
                why = ("a symbolic link: skipped (graph files must be regular files in the directory)"
                       if e.errno == errno.ELOOP else f"not read: {e.strerror or e}")
                log.warning("fusion repository %s: %s is %s", self.directory, name, why)
                skipped.append((name, why))
            except _Skip as e:
                log.warning("fusion repository %s: %s %s", self.directory, name, e)
                skipped.append((name, str(e)))
        return found, skipped

    def _read(self, name: str, path: str) -> GraphFile:
        fd = os.open(path, _READ_FLAGS)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Skip("is not a regular file: skipped")
            if st.st_size > self.max_file_bytes:
                raise _Skip(f"has {st.st_size} bytes, over the {self.max_file_bytes} a graph file may have: skipped")
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > self.max_file_bytes:  # it grew while being read
                    raise _Skip(f"is over the {self.max_file_bytes} bytes a graph file may have: skipped")
                chunks.append(chunk)
            return GraphFile(name, path, b"".join(chunks), st.st_mtime_ns)
        finally:
            os.close(fd)

    @staticmethod
    def is_file(path: str) -> bool:
        """Whether path is a regular file (not following a symlink)."""
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False

    # ---- writing -------------------------------------------------------------------------------
    def write(self, fusion_id: str, data: bytes, newer_than: list[str] = ()) -> str:
        """Write <id>.json atomically and durably, newer than the files `newer_than`; returns its
        path. Raises OSError, leaving no file behind."""
        path = self.path(fusion_id)
        for attempt in range(3):  # a name taken (planted, or left by a crash): another name
            tmp = os.path.join(self.directory, f".{fusion_id}.{secrets.token_hex(16)}.tmp")
            try:
                fd = os.open(tmp, _CREATE_FLAGS, 0o644)
                break
            except FileExistsError:
                if attempt == 2:
                    raise
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                self._make_newest(fd, newer_than)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        self._sync_directory()
        return path

    def _make_newest(self, fd: int, others: list[str]) -> None:
        """Give the open file a modification time after every file of `others` (clocks are coarse:
        a replacement written within the same tick would otherwise tie with what it replaces)."""
        newest = 0
        for p in others:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(p).st_mtime_ns)
        mine = os.fstat(fd).st_mtime_ns
        if mine <= newest:
            os.utime(fd, ns=(newest + 1, newest + 1))

    def remove(self, path: str) -> None:
        """Remove a file (gone already is fine), durably; raises OSError otherwise."""
        try:
            os.remove(path)
        except FileNotFoundError:
            return
        self._sync_directory()

    def set_aside(self, path: str) -> str:
        """Rename a file to <file>.superseded (not loaded again, kept for the operator)."""
        os.replace(path, path + SUPERSEDED)
        self._sync_directory()
        return path + SUPERSEDED

    def _sync_directory(self) -> None:
        """Make a rename or removal durable. Best effort: it has happened in the directory already,
        and the registry must agree with what the directory holds, so a failure here is only logged."""
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("fusion repository %s: fsync of the directory failed: %s", self.directory, e)


class _Skip(Exception):
    """A directory entry that is not a graph file to read."""
