"""`jaxdllm serve` and the Ray Serve application's arguments, without starting Ray (fast); the server
itself on a local Ray: tests/serving/test_ray_serve.py (slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jaxdllm.errors import ConfigError
from support.cli import cli_env

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed
import jaxdllm, jaxdllm.cli, jaxdllm.serving.engine
from jaxdllm.cli import main
sys.exit(main(["serve", "tasks-llada-small"]))
"""


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_without_ray_the_package_imports_and_serve_names_the_extra():
    out = subprocess.run([sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, env=cli_env(),
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "jaxdllm serve: error: jaxdllm serve needs Ray Serve and FastAPI (ray is missing): pip install 'jaxdllm[serve]'"]


def test_serve_is_a_command_with_its_flags():
    from jaxdllm.cli import COMMANDS, build_parser

    assert "serve" in COMMANDS and "jaxdllm serve MODEL" in sys.modules["jaxdllm.cli"].__doc__
    args = build_parser().parse_args(["serve", "tasks-llada-small", "--preset", "fast-dllm-parallel", "--replicas",
                                      "2", "--address", "ray://head:10001", "--port", "9000", "--slots", "4",
                                      "--max-queue", "16"])
    assert (args.model, args.preset, args.replicas, args.address, args.host, args.port, args.slots,
            args.max_queue) == ("tasks-llada-small", "fast-dllm-parallel", 2, "ray://head:10001", "127.0.0.1", 9000,
                                4, 16)


def test_app_arguments_from_the_command_line_are_typed_and_checked():
    pytest.importorskip("ray.serve", reason="the serve extra: pip install -e '.[serve]'")
    from jaxdllm.serving.ray_app import app_args, build_app

    args = app_args({"model": "tasks-llada-small", "slots": "4", "max_queue": "0", "warmup": "false",
                     "resources": '{"TPU": 4}', "num_gpus": "0.5", "max_replicas_per_node": "1"})
    assert (args["slots"], args["max_queue"], args["warmup"], args["resources"], args["num_gpus"],
            args["max_replicas_per_node"], args["replicas"]) == (4, 0, False, {"TPU": 4}, 0.5, 1, 1)
    for bad, words in (({}, "model=CHECKPOINT"), ({"model": "m", "slot": 2}, "unknown argument"),
                       ({"model": "m", "slots": "many"}, "slots must be a number"),
                       ({"model": "m", "slots": 0}, "slots must be at least 1"),
                       ({"model": "m", "preset": "fastest"}, "unknown preset"),
                       ({"model": "m", "resources": "TPU=4"}, "JSON object")):
        with pytest.raises(ConfigError, match=words):
            app_args(bad)
    with pytest.raises(ConfigError, match="data=D,fsdp=F,tensor=T"):
        app_args({"model": "m", "mesh": "tp=4"})
    assert app_args({"model": "m", "mesh": "fsdp=2,tensor=4"})["mesh"] == "fsdp=2,tensor=4"
    from ray.serve import Application

    assert isinstance(build_app({"model": "tasks-llada-small", "replicas": 2, "resources": {"TPU": 4}}), Application)


def test_the_serve_config_and_the_tpu_rayservice_deploy_build_app_with_valid_arguments():
    pytest.importorskip("ray.serve", reason="the serve extra: pip install -e '.[serve]'")
    import math
    from pathlib import Path

    import yaml

    from jaxdllm.serving.ray_app import app_args

    folder = Path(__file__).resolve().parents[2] / "sampling" / "serve"
    config = yaml.safe_load((folder / "serve_config.yaml").read_text())
    [app] = config["applications"]
    assert app["import_path"] == "jaxdllm.serving.ray_app:build_app" and app["route_prefix"] == "/"
    app_args(app["args"])

    service = yaml.safe_load((folder / "rayservice_tpu.yaml").read_text())
    assert service["kind"] == "RayService"
    [app] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    args = app_args(app["args"])
    assert app["import_path"] == "jaxdllm.serving.ray_app:build_app"
    [workers] = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    pod = workers["template"]["spec"]
    chips = int(pod["containers"][0]["resources"]["limits"]["google.com/tpu"])
    # one replica per TPU host, holding every chip of it, its weights over all of them
    assert args["replicas"] == workers["replicas"] * workers["numOfHosts"] and args["max_replicas_per_node"] == 1
    assert args["resources"] == {"TPU": chips}
    sizes = dict(part.split("=") for part in args["mesh"].split(","))
    assert math.prod(int(v) for v in sizes.values()) == chips
    assert pod["terminationGracePeriodSeconds"] > args["graceful_shutdown_timeout_s"]


@pytest.mark.mesh
def test_a_replica_mesh_spans_its_devices():
    pytest.importorskip("ray.serve", reason="the serve extra: pip install -e '.[serve]'")
    from jaxdllm.serving.ray_app import replica_mesh

    mesh = replica_mesh("fsdp=2,tensor=4")  # the session's 8 CPU devices
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    with pytest.raises(ConfigError, match="devices"):
        replica_mesh("tensor=3")
