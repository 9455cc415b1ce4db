"""The one exception the client raises."""

from __future__ import annotations


class ClientError(Exception):
    """A request failed: the server answered with an error, or it could not be reached (or the
    client refused it before sending: a region without a size, a graph file that is not JSON).

    `status` is the HTTP status (None when no answer came back), `message` the server's
    `error` text, `details` its list of `{"loc": [...], "msg": ...}` entries, `url` the
    request's URL.
    """

    def __init__(self, message: str, status: int | None = None, details: list[dict] | None = None,
                 url: str | None = None):
        self.message = message
        self.status = status
        self.details = list(details or [])
        self.url = url
        super().__init__(message)

    def __str__(self) -> str:
        head = f"[{self.status}] {self.message}" if self.status is not None else self.message
        lines = [head]
        for d in self.details:
            loc = ".".join(str(p) for p in d.get("loc", []))
            msg = str(d.get("msg", ""))
            if msg not in self.message:  # the server often repeats a detail in its message
                lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ClientError({self.message!r}, status={self.status!r}, details={self.details!r})"
