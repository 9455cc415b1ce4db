#!/usr/bin/env bash
# Ray's wheel without what Ray Serve does not import, so that .raylite fits the device tool's 64 MiB
# carry (benchmarks/device_ab_ray.sh): 79 MB as published, 40.2 MB after. Drops ray/jars (Java
# workers), rllib, data, llm, train, tune, the dashboard's web client and the .js.map files, through
# the `wheel` tool (pip install wheel), which rewrites RECORD:
#   bash benchmarks/trim_ray_wheel.sh .raywhl/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl .raylite
set -eu
src=$1 dest=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m wheel unpack "$src" -d "$tmp"
d=$(echo "$tmp"/ray-*)
rm -rf "$d"/ray/{jars,rllib,data,llm,train,tune,dashboard/client}
find "$d" -name '*.js.map' -delete
python3 -m wheel pack "$d" -d "$dest"
