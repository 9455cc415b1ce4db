"""Parsed infer bodies kept for reuse: a decode loop sends the same small body (buffer names only)
on every step, and parsing plus validating it again costs more host time than the run launches.

A hit needs the same fusion object (a re-registration is a new object), the same version in the
URL and byte-identical JSON. Only parsed runs (server/run_records.py ParsedRun) that hold no data
and no state are kept: every input a stored buffer, no shared-memory region, no `parameters.timeout`
(its deadline is per request). What a parsed run names is still checked per run where it can change
(buffers exist, shapes bind, pins).
Read and written on the event loop only."""

from __future__ import annotations

from collections import OrderedDict

MAX_BODY_BYTES = 2048  # bodies of buffer names; inline data is rarely repeated byte for byte
MAX_ENTRIES = 512


class ParsedRequests:
    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(model: str, version: str | None, body: bytes, header_length: str | None):
        """The cache key of a request, or None when it may not be cached at all."""
        if header_length is not None or len(body) > MAX_BODY_BYTES:
            return None
        return model, version, body

    def get(self, key, fusion):
        """(request, ParsedRun) parsed before for this key and fusion, else None."""
        entry = self._entries.get(key)
        if entry is None or entry[0] is not fusion:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[1], entry[2]

    def put(self, key, fusion, req, parsed) -> None:
        if parsed.deadline is not None or any(i.buffer is None or i.region is not None for i in parsed.inputs) \
                or any(o.region is not None for o in parsed.outputs):
            return
        self._entries[key] = (fusion, req, parsed)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
