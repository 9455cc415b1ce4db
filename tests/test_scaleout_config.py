"""The configuration of `segfuse serve-ray`, offline (no cluster): bad arguments fail naming them
before Ray starts, a shard reserves what its options say (a fraction of a GPU shares one), and
docker/kuberay.yaml carries the router design: a RayCluster whose GPU workers hold one shard each,
and a router Deployment that joins it through Ray Client with the same options."""

from __future__ import annotations

import pytest
import yaml
from helpers.processes import ROOT
from segfuse.cli import main as cli_main

pytest.importorskip("ray", reason="segfuse serve-ray needs the ray extra")


@pytest.mark.parametrize("args, message", [({"shards": 0}, "shards must be an integer of at least 1"),
                                           ({"max_namespaces": 0}, "max_namespaces must be an integer of at least 1"),
                                           ({"backend": "auto"}, "backend must be numpy or cupy"),
                                           ({"backend": "cupy", "shard_gpus": 2}, "shard_gpus must be at most 1"),
                                           ({"shard_gpus": 0}, "shard_gpus must be a number above 0"),
                                           ({"shard_cpus": "many"}, "shard_cpus must be a number of at least 0"),
                                           ({"port": 0}, "port must be 1-65535"),
                                           ({"settings": {"max_queued_runs": 0}}, "settings: max_queued_runs"),
                                           ({"settings": {"colour": "red"}}, "settings: .*colour"),
                                           ({"ingress_cpus": 1}, "unexpected keyword argument 'ingress_cpus'")])
def test_bad_arguments_fail_before_ray_starts(args, message):
    import ray
    from segfuse.scaleout import serve_ray

    with pytest.raises((ValueError, TypeError), match=message):
        serve_ray.start(**args)
    assert not ray.is_initialized()


@pytest.mark.parametrize("argv, message", [(["--shards", "0"], "at least 1"),
                                           (["--max-namespaces", "0"], "at least 1"),
                                           (["--mps"], "--mps is for CuPy shards")])
def test_cli_reports_bad_arguments(capsys, argv, message):
    assert cli_main(["serve-ray", *argv]) == 2
    assert message in capsys.readouterr().err


def test_shard_gpus_shares_one_gpu_between_shards():
    """--shard-gpus 0.5: each CuPy shard reserves half a GPU (two shards fit one GPU, as Ray places
    fractional GPUs); NumPy shards reserve none whatever it says."""
    from segfuse.scaleout.cluster import ShardCluster, shard_resources

    assert ShardCluster(2, "cupy", shard_gpus=0.5).resources == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert shard_resources({"backend": "numpy", "shard_gpus": 0.5})["num_gpus"] == 0
    assert shard_resources({"backend": "cupy"})["num_gpus"] == 1


def _kuberay() -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all((ROOT / "docker" / "kuberay.yaml").read_text()) if d}


def test_kuberay_gives_each_shard_a_gpu_pod_and_the_router_joins_with_the_same_options():
    import ray
    from segfuse.cli import build_parser
    from segfuse.scaleout.cluster import ShardCluster

    docs = _kuberay()
    cluster, router = docs["RayCluster"], docs["Deployment"]
    (c,) = router["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(c["command"][1:] + c.get("args", []))
    assert c["command"][:2] == ["segfuse", "serve-ray"] and args.backend == "cupy" and args.host == "0.0.0.0"
    head_svc = f"{cluster['metadata']['name']}-head-svc"  # the Service KubeRay makes for the head
    assert args.address == f"ray://{head_svc}:10001"
    shards = ShardCluster(args.shards, args.backend, shard_cpus=args.shard_cpus, shard_gpus=args.shard_gpus)
    workers = cluster["spec"]["workerGroupSpecs"]
    pods = [(w["replicas"], w["template"]["spec"]["containers"][0]["resources"]["limits"]) for w in workers]
    assert all(str(lim["nvidia.com/gpu"]) == "1" for _, lim in pods)  # one GPU per pod ...
    assert sum(n for n, _ in pods) * 1 == len(shards.ids) * shards.resources["num_gpus"]  # ... a pod per shard
    assert all(float(lim["cpu"]) >= shards.resources["num_cpus"] for _, lim in pods)  # a shard fits its pod
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no shard on the head
    assert cluster["spec"]["rayVersion"].rsplit(".", 1)[0] == ".".join(ray.__version__.split(".")[:2])
    assert docs["Service"]["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
