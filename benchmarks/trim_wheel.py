"""Rewrite a wheel without some of its folders, so that Ray fits the device tool's 64 MiB carry
(benchmarks/device_ab_ray.sh carries .raylite: ray 2.60.0's wheel is 79 MB as published). Drops
every file under the given prefixes and their RECORD lines; pip installs the result as usual.

    python benchmarks/trim_wheel.py .raylite/ray-2.60.0-*.whl ray/jars ray/rllib ray/data ray/llm \
        ray/train ray/tune ray/dashboard/client

(A wheel is a zip file with a RECORD manifest: the zipfile module is all it takes. By hand because
the `wheel` tool's `unpack`/`pack`, made for this, refuse Ray's wheel: `unpack` stops at a RECORD
hash mismatch of a file Ray vendors under ray/_private/runtime_env, checked 2026-12-02.)"""

from __future__ import annotations

import os
import sys
import zipfile


def trim(path: str, prefixes: list[str]) -> tuple[int, int]:
    """Rewrite `path` in place; (bytes before, bytes after)."""
    def dropped(name: str) -> bool:
        return any(name == p or name.startswith(p.rstrip("/") + "/") for p in prefixes)

    before, tmp = os.path.getsize(path), path + ".tmp"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if dropped(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(ln for ln in lines if not dropped(ln.split(",", 1)[0])) + "\n").encode()
            dst.writestr(info, data)
    os.replace(tmp, path)
    return before, os.path.getsize(path)


if __name__ == "__main__":
    a, b = trim(sys.argv[1], sys.argv[2:])
    print(f"{sys.argv[1]}: {a / 1e6:.1f} MB -> {b / 1e6:.1f} MB")
