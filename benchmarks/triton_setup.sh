#!/usr/bin/env bash
# Prepare a real Triton Inference Server for benchmarks/triton_side_by_side.py, from PyPI only:
#   bash benchmarks/triton_setup.sh            # into benchmarks/out/triton (ignored by git)
#   DEST=/some/dir PYTHON=python3.12 bash benchmarks/triton_setup.sh
# (tests/test_triton_conformance.py runs it into ~/.cache/segfuse/triton-2.51.0 through tests/helpers/triton_install.py)
# Lays out, under $DEST:
#   venv/    its own virtual environment: nvidia-pytriton 0.7.0 (bundles tritonserver 2.51.0 and the Python
#            backend), tritonclient 2.51.0 (whose manylinux wheel carries the perf_analyzer binary) and numpy<2
#            (the Python stub misreads tensors under numpy 2)
#   server/  bin/tritonserver, backends/ (python backend with the stub built for the venv's Python), caches/,
#            as PyTriton lays them out itself
#   lib/     libb64.so.0d and libcudart.so.12 links to the hash-named copies in nvidia_pytriton.libs/:
#            perf_analyzer asks for them by those names
#   env.sh   LD_LIBRARY_PATH and PATH for tritonserver and perf_analyzer (sourced by the benchmark's launcher)
# A GPU host without network: on a machine with one, `WHEELS=.whl/triton PY=3.12 bash benchmarks/triton_setup.sh
# download` fetches the wheels for that Python; carry the folder, then on the host `WHEELS=.whl/triton bash
# benchmarks/triton_setup.sh` installs from it alone. SYSTEM_SITE=1 lets the venv see the host's packages (its
# torch, for --triton-histogram torch; the venv's own numpy<2 comes first); EXTRA="torch" installs torch instead.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${DEST:-$HERE/out/triton}
PYTHON=${PYTHON:-python3}
# Without their Python dependencies: only the wheels' binaries are used (tritonserver, its backends, perf_analyzer),
# and the Python stub needs numpy alone (pytriton's own client stack pins geventhttpclient<=2.0.2: no wheel for 3.12).
BINARIES=("nvidia-pytriton==0.7.0" "tritonclient==2.51.0")
NUMPY="numpy<2"
if [ "${1:-}" = download ]; then
  "$PYTHON" -m pip download --quiet --only-binary=:all: --python-version "${PY:-3.12}" \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --no-deps -d "${WHEELS:?folder for the wheels}" \
    "${BINARIES[@]}" "$NUMPY"
  echo "wheels for Python ${PY:-3.12} in $WHEELS"; exit 0
fi
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
VENV="$DEST/venv"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv ${SYSTEM_SITE:+--system-site-packages} "$VENV"
fi
FROM=()
[ -n "${WHEELS:-}" ] && FROM=(--no-index --find-links "$WHEELS")
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet "${FROM[@]}" --no-deps "${BINARIES[@]}"
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet "${FROM[@]}" "$NUMPY" ${EXTRA:-}

SP=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PYV=$("$VENV/bin/python" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
PY_LIBDIR=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
STUB="$SP/pytriton/tritonserver/python_backend_stubs/$PYV/triton_python_backend_stub"
[ -f "$STUB" ] || { echo "no Python backend stub for Python $PYV in the wheel (have: $(ls "$SP/pytriton/tritonserver/python_backend_stubs"))" >&2; exit 1; }

rm -rf "$DEST/server"; mkdir -p "$DEST/server"
cp -r "$SP/pytriton/tritonserver/bin" "$SP/pytriton/tritonserver/backends" "$SP/pytriton/tritonserver/caches" "$DEST/server/"
cp "$STUB" "$DEST/server/backends/python/"

LIBS="$SP/nvidia_pytriton.libs"
rm -rf "$DEST/lib"; mkdir -p "$DEST/lib"
for want in libb64.so.0d libcudart.so.12; do
  stem=${want%%.so*}
  have=$(ls "$LIBS" | grep -E "^${stem}-[0-9a-f]+\.so" | head -n 1 || true)
  if [ -n "$have" ]; then ln -sf "$LIBS/$have" "$DEST/lib/$want"; else echo "note: no $stem in $LIBS (perf_analyzer may not start)" >&2; fi
done

PA=$(ls "$VENV"/bin/perf_analyzer 2>/dev/null || true)
# Why each variable: the stub runs Python in isolated mode and takes `python3` from PATH, so PATH must start with
# the venv (numpy<2); LD_LIBRARY_PATH holds the wheel's libraries and the directory of the libpython the venv's
# Python was built with (else the stub may load another libpython and the model never loads).
cat > "$DEST/env.sh" <<EOF
export TRITON_DIST="$DEST/server"
export TRITON_VENV="$VENV"
export PERF_ANALYZER="${PA}"
export LD_LIBRARY_PATH="$LIBS:$PY_LIBDIR:$DEST/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$VENV/bin:\$PATH"
EOF
echo "Triton laid out in $DEST (tritonserver: $DEST/server/bin/tritonserver, perf_analyzer: ${PA:-none})"
