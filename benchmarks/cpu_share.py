"""Where the CPU goes during a load level, by process: utime + stime from /proc/<pid>/stat before and
after, grouped by what the process is (a shard by its Ray title `ray::ShardHost` or its SEGFUSE_SHARD_ID,
Ray's daemons, HAProxy, a `segfuse serve`). On a machine whose cores are all busy this says
which process a request's time is spent in; py-spy alone cannot (it sees Ray's C++ threads, which
do the RPC work, as one Python frame each). Linux only.

    before = snapshot({sid}); ...level...; share = delta(before, snapshot({sid}), requests, seconds)
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
GROUPS = [  # (group, title prefix), first match wins
    ("shards", "ray::ShardHost"), ("HAProxy", "haproxy"), ("raylet", "raylet"), ("GCS", "gcs_server"),
    ("Ray agents", "ray::DashboardAgent"), ("Ray agents", "ray::RuntimeEnvAgent"), ("Ray agents", "ray::IDLE"),
]  # (wrk is not here: it has exited when the level's second snapshot is taken)


def _group(title: str, servers: set[int], pid: int) -> str | None:
    if pid in servers:
        return "segfuse serve"
    name = title.rsplit("/", 1)[-1]
    for group, prefix in GROUPS:
        if title.startswith(prefix) or name.startswith(prefix):
            return group
    try:  # a shard of `segfuse serve --processes N --route` (cli/serve_group.py names it in its environment)
        if b"\0SEGFUSE_SHARD_ID=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
            return "shards"
    except OSError:
        pass
    return None


def processes(sessions: set[int]):
    """(pid, title, fields of /proc/pid/stat after the command) of the processes in `sessions`."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            title = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if int(fields[3]) in sessions:
            yield int(d.name), title, fields


def snapshot(sessions: set[int], servers: set[int] = frozenset()) -> dict[int, tuple[str, int]]:
    """pid -> (group, CPU ticks) of every process of a known group in `sessions` (a `segfuse
    serve-ray` started in a session of its own: Ray's processes stay in it) or in `servers` (pids
    of `segfuse serve`)."""
    out = {}
    for pid, title, fields in processes(set(sessions) | {_session(p) for p in servers}):
        group = _group(title, servers, pid)
        if group is not None:
            out[pid] = (group, int(fields[11]) + int(fields[12]))  # utime, stime
    return out


def _session(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2:].split()[3])


def delta(before: dict, after: dict, requests: int, seconds: float) -> dict:
    """Per group: cores busy on average, and CPU microseconds per request."""
    ticks: dict[str, int] = {}
    for pid, (group, t) in after.items():
        ticks[group] = ticks.get(group, 0) + t - before.get(pid, (group, 0))[1]
    return {g: {"cores": t / TICK / seconds, "us_per_request": t / TICK * 1e6 / max(1, requests)}
            for g, t in sorted(ticks.items(), key=lambda kv: -kv[1]) if t > 0}
