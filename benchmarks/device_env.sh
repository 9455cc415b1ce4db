# Source on the GPU machine, in the repository root, after carrying .whl and .tools there
# (benchmarks/device_tools.sh makes them):   source benchmarks/device_env.sh
# - installs .whl into .site once (the setup of tests/gpu/RESULTS.md) and puts .site on PYTHONPATH
#   and .site/bin (py-spy) on PATH;
# - makes segfuse importable from this tree (/tmp/sp/segfuse/{compiler,server,client,cli,scaleout,torch} links;
#   segfuse.torch's directory is torch_ext);
# - puts .tools/bin (wrk, which sets LD_LIBRARY_PATH to .tools/root's lib dirs for itself) on PATH.
_sf_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -d "$_sf_root/.whl" ] && [ ! -d "$_sf_root/.site" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_sf_root/.site" "$_sf_root"/.whl/*.whl || echo "device_env.sh: installing .whl failed" >&2
fi
mkdir -p /tmp/sp/segfuse
for _sf_p in compiler server client cli scaleout torch_ext; do ln -sfn "$_sf_root/$_sf_p" "/tmp/sp/segfuse/${_sf_p%_ext}"; done
export PYTHONPATH="$_sf_root/.site:/tmp/sp${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$_sf_root/.tools/bin:$_sf_root/.site/bin:$PATH"
command -v wrk >/dev/null && wrk -v 2>&1 | head -1
# part NAME SECONDS COMMAND...: COMMAND's output into $OUT/NAME.txt, stopped by SIGINT after SECONDS
# (so pytest and the benchmarks still print what they have); SECONDS 0 skips it (and returns 1)
part() {
  local name=$1 secs=$2; shift 2
  [ "$secs" = 0 ] && { echo "== $name skipped"; return 1; }
  echo "== $name ($(date -u +%H:%M:%S), limit ${secs}s)"
  timeout -k 15 -s INT "$secs" "$@" > "$OUT/$name.txt" 2>&1
  echo "rc=$?"
}
unset _sf_root _sf_p
