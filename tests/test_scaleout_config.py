"""The config forms of `segfuse serve-ray`, offline (no cluster): examples/serve-ray.yaml, what
`--print-config` writes and docker/rayservice.yaml's serveConfigV2 validate against Ray Serve's own
schema (ray.serve.schema.ServeDeploySchema, pydantic) and their import paths and args build the
applications; the RayService gives each shard one GPU; bad arguments fail naming them."""

from __future__ import annotations

import importlib
import os

import pytest
from segfuse.cli import main as cli_main

pytest.importorskip("ray.serve", reason="segfuse serve-ray needs the ray extra")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_serve_config(doc: dict, shards: int) -> list:
    """`doc` is a valid Serve config (Ray Serve's own schema) whose applications really build: the
    ingress of `shards` shards at /, shard i at /shards/shard-<i>. Returns the applications' args."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema
    from segfuse.scaleout import serve_ray

    config = ServeDeploySchema.model_validate(doc)
    apps = {a.name: a for a in config.applications}
    assert set(apps) == {"segfuse", *(f"segfuse-shard-{i}" for i in range(shards))}
    assert apps["segfuse"].route_prefix == "/" and apps["segfuse"].args["shards"] == shards
    for i in range(shards):
        assert apps[f"segfuse-shard-{i}"].route_prefix == f"/shards/shard-{i}"
        assert apps[f"segfuse-shard-{i}"].args["shard"] == i
    for app in apps.values():
        module, _, name = app.import_path.partition(":")
        builder = getattr(importlib.import_module(module), name)  # the import path resolves ...
        assert builder in (serve_ray.build_ingress, serve_ray.build_shard)
        assert isinstance(builder(app.args), serve.Application)  # ... and its args build
    return [a.args for a in config.applications]


def test_config_example_is_a_valid_serve_config_and_builds():
    import yaml

    with open(os.path.join(ROOT, "examples", "serve-ray.yaml")) as f:
        check_serve_config(yaml.safe_load(f), 2)


def test_print_config_writes_a_valid_config(capsys):
    import yaml

    assert cli_main(["serve-ray", "--shards", "3", "--max-namespaces", "5", "--print-config"]) == 0
    args = check_serve_config(yaml.safe_load(capsys.readouterr().out), 3)
    assert [a["max_namespaces"] for a in args[1:]] == [5, 5, 5]


@pytest.mark.parametrize("builder, args, message", [
    ("build_ingress", {"shards": 0}, "at least 1"), ("build_shard", {"backend": "auto"}, "numpy or cupy"),
    ("build_shard", {"max_namespaces": 0}, "max_namespaces must be an integer of at least 1"),
    ("build_shard", {"health_check_period_s": 0}, "health_check_period_s must be a number above 0"),
    ("build_shard", {"shard_cpus": "many"}, "shard_cpus must be a number of at least 0"),
    ("build_shard", {"shard_gpus": 0}, "shard_gpus must be a number above 0"),
    ("build_shard", {"backend": "cupy", "shard_gpus": 2}, "shard_gpus must be at most 1"),
    ("build_shard", {"settings": {"max_queued_runs": 0}}, "settings: max_queued_runs must be at least 1"),
    ("build_shard", {"settings": {"colour": "red"}}, "settings: .*colour"),
    ("build_ingress", {"replicas": 2}, "unknown ingress arguments"),
    ("build_shard", {"shards": 2}, "unknown shard arguments")])
def test_bad_arguments(builder, args, message):
    from segfuse.scaleout import serve_ray

    with pytest.raises(ValueError, match=message):
        getattr(serve_ray, builder)(args)


@pytest.mark.parametrize("argv, message", [(["--shards", "0"], "at least 1"),
                                           (["--max-namespaces", "0"], "at least 1")])
def test_cli_reports_bad_arguments(capsys, argv, message):
    assert cli_main(["serve-ray", *argv]) == 2
    assert message in capsys.readouterr().err


def _rayservice() -> dict:
    import yaml

    with open(os.path.join(ROOT, "docker", "rayservice.yaml")) as f:
        return yaml.safe_load(f)


def test_rayservice_serve_config_is_valid_and_builds():
    import yaml

    manifest = _rayservice()
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    args = check_serve_config(serve_config, 2)
    assert all(a["backend"] == "cupy" for a in args[1:])  # GPU shards
    assert serve_config["http_options"]["host"] == "0.0.0.0"  # reachable from the pod's service


def test_rayservice_is_what_print_config_writes(capsys):
    import yaml

    argv = ["serve-ray", "--shards", "2", "--backend", "cupy", "--host", "0.0.0.0", "--shard-cpus", "4",
            "--max-queued-runs", "1024", "--print-config"]
    assert cli_main(argv) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])


def test_rayservice_gives_each_shard_one_gpu():
    import ray
    import yaml
    from segfuse.scaleout.serve_ray import shard_resources

    manifest = _rayservice()
    cluster = manifest["spec"]["rayClusterConfig"]
    shards = [a["args"] for a in yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
              if a["import_path"].endswith(":build_shard")]
    assert all(shard_resources(a)["num_gpus"] == 1 for a in shards)
    workers = cluster["workerGroupSpecs"]
    gpus = [(w["replicas"], c["resources"]["limits"].get("nvidia.com/gpu", 0))
            for w in workers for c in w["template"]["spec"]["containers"]]
    assert all(g == 1 for _, g in gpus)  # one GPU per pod ...
    assert sum(n for n, g in gpus) == len(shards)  # ... and a pod per shard
    cpus = {c["resources"]["limits"]["cpu"] for w in workers for c in w["template"]["spec"]["containers"]}
    assert all(float(c) >= shard_resources(shards[0])["num_cpus"] for c in cpus)  # a shard fits in its pod
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # shards (>= 1 CPU) never land on the head
    assert cluster["rayVersion"].rsplit(".", 1)[0] == ".".join(ray.__version__.split(".")[:2])
    for c in [*head["template"]["spec"]["containers"], *(c for w in workers for c in w["template"]["spec"]["containers"])]:
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


@pytest.mark.parametrize("args, message", [({"shards": 0}, "shards must be an integer of at least 1"),
                                           ({"max_namespaces": 0}, "max_namespaces must be an integer of at least 1"),
                                           ({"backend": "cupy", "shard_gpus": 2}, "shard_gpus must be at most 1"),
                                           ({"port": 0}, "port must be 1-65535"),
                                           ({"settings": {"max_ops": -1}}, "settings:"),
                                           ({"ingress_cpus": 1}, "unknown serve-ray arguments")])
def test_bad_arguments_fail_before_ray_starts(args, message):
    import ray
    from segfuse.scaleout import serve_ray

    with pytest.raises(ValueError, match=message):
        serve_ray.start(**args)
    assert not ray.is_initialized()


def test_shard_gpus_shares_one_gpu_between_shards(capsys):
    """--shard-gpus 0.5: each CuPy shard reserves half a GPU (two shards fit one GPU, as Ray places
    fractional GPUs); the config file carries it, and NumPy shards reserve none whatever it says."""
    import yaml
    from segfuse.scaleout.serve_ray import shard_resources

    assert cli_main(["serve-ray", "--shards", "2", "--backend", "cupy", "--shard-gpus", "0.5", "--print-config"]) == 0
    shards = [a["args"] for a in yaml.safe_load(capsys.readouterr().out)["applications"]
              if a["import_path"].endswith(":build_shard")]
    assert [shard_resources(a)["num_gpus"] for a in shards] == [0.5, 0.5]
    assert shard_resources({"backend": "numpy", "shard_gpus": 0.5})["num_gpus"] == 0
    assert shard_resources({"backend": "cupy"})["num_gpus"] == 1
