#!/usr/bin/env bash
# Build both images and check them, on a machine that reaches Debian's mirror and PyPI but no
# container registry (CI's): .ci/run calls it; SEGFUSE_CI_IMAGES=0 skips it there.
#
#   bash docker/images.sh                 # as root, on Debian
#
# 1. A Docker engine: Debian's docker.io (started here when none answers, stopped at the end) and
#    the compose v2 and buildx CLI plugins from Debian trixie's packages (bookworm has neither).
# 2. The base, segfuse-base:trixie: a minimal Debian trixie (python3 3.13 and venv) bootstrapped
#    from the Debian mirror with mmdebstrap, holding this machine's CA certificates so pip inside a
#    build trusts a TLS-inspecting proxy as the host does. Kept as an image: a second run reuses it.
# 3. docker build of docker/Dockerfile.cpu and docker/Dockerfile on that base.
# 4. docker/check_images.py: the README's curl session on the CPU image, non-root, HEALTHCHECK,
#    a clean stop, the GPU image compiling a kernel with NVRTC (no GPU) and refusing to serve on
#    the CPU by default, and docker/compose.yaml up and down with docker/compose.ci.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${SEGFUSE_BASE_IMAGE:-segfuse-base:trixie}
WORK=$(mktemp -d)
STARTED_DOCKERD=
cleanup() {
  if [ -n "$STARTED_DOCKERD" ]; then
    kill "$STARTED_DOCKERD" 2>/dev/null || true
    wait "$STARTED_DOCKERD" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { printf '[images %s] %s\n' "$(date +%T)" "$*"; }

# ---- 1. engine and plugins -------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { cat "$WORK/dockerd.log"; echo "dockerd did not start" >&2; exit 1; }
fi
PLUGINS=/usr/local/lib/docker/cli-plugins
if ! docker compose version >/dev/null 2>&1 || ! docker buildx version >/dev/null 2>&1; then
  say "installing the compose and buildx plugins from Debian trixie"
  mkdir -p "$WORK/lists/partial" "$WORK/debs" "$PLUGINS"
  echo "deb http://deb.debian.org/debian trixie main" >"$WORK/sources.list"
  apt_trixie=(-o "Dir::Etc::SourceList=$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$WORK/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  apt-get "${apt_trixie[@]}" update -qq
  (cd "$WORK/debs" && apt-get "${apt_trixie[@]}" download docker-compose docker-buildx 2>/dev/null)
  for deb in "$WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$WORK/root"; done
  install -m 755 "$WORK"/root/usr/libexec/docker/cli-plugins/docker-{compose,buildx} "$PLUGINS/"
fi
say "$(docker version --format 'engine {{.Server.Version}}'), $(docker compose version), $(docker buildx version | cut -d' ' -f1,2)"

# ---- 2. base ---------------------------------------------------------------------------------
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  say "bootstrapping $BASE from the Debian mirror"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='sync-in /usr/local/share/ca-certificates /usr/local/share/ca-certificates' \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    trixie "$WORK/base.tar"
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$WORK/base.tar" "$BASE" >/dev/null
  rm -f "$WORK/base.tar"
fi

# ---- 3. images -------------------------------------------------------------------------------
export DOCKER_BUILDKIT=1  # the per-Dockerfile .dockerignore files need BuildKit
say "building segfuse:cpu"
docker build -q -f docker/Dockerfile.cpu --build-arg "BASE_IMAGE=$BASE" -t segfuse:cpu . >/dev/null
say "building segfuse:cuda13"
docker build -q -f docker/Dockerfile --build-arg "CUDA_IMAGE=$BASE" -t segfuse:cuda13 . >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' segfuse

# ---- 4. checks -------------------------------------------------------------------------------
say "checking"
python3 docker/check_images.py
say "done"
