# Source on the GPU machine, in the repository root, after carrying .whl and .tools there
# (benchmarks/device_tools.sh makes them):   source benchmarks/device_env.sh
# (benchmarks/device_session.sh does it; benchmarks/README.md, "Running on a GPU machine")
# - installs .whl into .site once and puts .site on PYTHONPATH
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
# the entry points an install would declare (torch.compile(backend="segfuse") finds the backend through them)
python3 - "$_sf_root/pyproject.toml" /tmp/sp/segfuse-0.1.0.dist-info <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path(sys.argv[1]).read_text())["project"]
out = pathlib.Path(sys.argv[2])
out.mkdir(exist_ok=True)
(out / "METADATA").write_text(f"Metadata-Version: 2.1\nName: segfuse\nVersion: {project['version']}\n")
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
(out / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in e.items()) + "\n"
                                              for g, e in groups.items()))
PY
export PYTHONPATH="$_sf_root/.site:/tmp/sp${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$_sf_root/.tools/bin:$_sf_root/.site/bin:$PATH"
command -v wrk >/dev/null && wrk -v 2>&1 | head -1
unset _sf_root _sf_p
