#!/usr/bin/env bash
# Prepares, in the repository root of this machine (which reaches PyPI and Debian), what the
# offline GPU machine needs to run benchmarks/load.py with wrk and py-spy:
#   .whl/         wheels for CPython 3.12 manylinux x86_64: the web stack that
#                 ../shared/gpu-machine/fetch-wheels.sh fetches, plus httptools, orjson, xxhash and py-spy
#                 (the GPU image already has uvloop, httpx, prometheus-client, numpy, cupy)
#   .tools/root/  wrk and the libraries it links (LuaJIT, OpenSSL 3) from Debian packages (dpkg -x)
#   .tools/bin/wrk  runs .tools/root/usr/bin/wrk with those libraries on LD_LIBRARY_PATH
# Carry .whl and .tools along (both ignored by git), then there, in the repository root:
#   source benchmarks/device_env.sh && python3 benchmarks/load.py --backend cupy --duration 5
# Usage: bash benchmarks/device_tools.sh [--no-wheels] [--no-wrk]
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
wheels=1 tools=1
for a in "$@"; do
  case "$a" in
    --no-wheels) wheels=0 ;;
    --no-wrk) tools=0 ;;
    *) echo "usage: $0 [--no-wheels] [--no-wrk]" >&2; exit 2 ;;
  esac
done
# asgi-lifespan (and its sniffio): the server tests of the GPU suite (tests/conftest.py asgi_server);
# lazy-importer: importlib-metadata 10 (fetched by fetch-wheels.sh, first on PYTHONPATH there) needs it;
# grpcio and Triton's client with its HTTP needs (gevent, ...): the protocol tests of the GPU suite
EXTRA_WHEELS=(httptools orjson py-spy lazy-importer fastapi-offline asgi-lifespan sniffio xxhash grpcio protobuf
              tritonclient python-rapidjson nvidia-ml-py filelock gevent geventhttpclient greenlet zope.event
              zope.interface brotli certifi urllib3 aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict
              propcache yarl idna)

if [ "$wheels" = 1 ]; then
  fetch="$root/../shared/gpu-machine/fetch-wheels.sh"
  [ -f "$fetch" ] || { echo "missing $fetch" >&2; exit 1; }
  if [ -d .git ]; then
    bash "$fetch" "${EXTRA_WHEELS[@]}"
  else
    # A git worktree: .git is a file, and fetch-wheels.sh appends to .git/info/exclude. Run it in
    # a scratch repository and take its .whl (this repository's .gitignore already has /.whl/).
    scratch=$(mktemp -d)
    git -C "$scratch" init -q
    (cd "$scratch" && bash "$fetch" "${EXTRA_WHEELS[@]}")
    mkdir -p .whl
    cp "$scratch"/.whl/*.whl .whl/
    rm -rf "$scratch"
  fi
fi

if [ "$tools" = 1 ]; then
  if ! git check-ignore -q .tools/; then
    echo '/.tools/' >> "$(git rev-parse --git-path info/exclude)"
  fi
  candidate() { [ "$(apt-cache policy "$1" 2>/dev/null | grep -c 'Candidate: [0-9]')" != 0 ]; }
  candidate wrk || apt-get update -qq
  pick() { for p in "$@"; do if candidate "$p"; then echo "$p"; return; fi; done; echo "none of: $*" >&2; exit 1; }
  pkgs=(wrk "$(pick libluajit-5.1-2 libluajit2-5.1-2)" "$(pick libssl3 libssl3t64)")
  rm -rf .tools
  mkdir -p .tools/debs .tools/root .tools/bin
  (cd .tools/debs && apt-get download -qq "${pkgs[@]}")
  for d in .tools/debs/*.deb; do dpkg -x "$d" .tools/root; done
  rm -rf .tools/debs .tools/root/usr/share/doc .tools/root/usr/share/man .tools/root/usr/share/lintian
  cat > .tools/bin/wrk <<'EOF'
#!/bin/sh
# wrk extracted from Debian packages, with its own LuaJIT and OpenSSL (benchmarks/device_tools.sh).
# The libraries go on LD_LIBRARY_PATH for wrk alone, not for the shell: they would shadow the
# image's OpenSSL for python3 and everything else started from it.
t=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$t/root/usr/lib/x86_64-linux-gnu:$t/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "$t/root/usr/bin/wrk" "$@"
EOF
  chmod +x .tools/bin/wrk
  echo "packages in .tools/root: ${pkgs[*]}"
  echo "newest glibc symbol they need: $(grep -aoh 'GLIBC_2\.[0-9]*' .tools/root/usr/bin/wrk \
    .tools/root/usr/lib/x86_64-linux-gnu/*.so* | sort -uV | tail -1) (the GPU machine's glibc must be at least that)"
  env -i PATH=/usr/bin:/bin "$root/.tools/bin/wrk" -v 2>&1 | head -1 || true
fi
du -sh .whl .tools 2>/dev/null || true
