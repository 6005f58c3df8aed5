"""The multi-host launch files in `training/launch/` (no cluster, no network): the shell files
parse (`bash -n`), the TPU script's dry run and the SLURM script under a stub `srun` print the
command every host runs, and that command, like the JobSet's, is `jaxdllm train RECIPE
--distributed` with flags `jaxdllm train` has, a recipe in `training/`, a mesh over exactly the
cluster's devices and a global batch those devices divide. Nothing imports jax (fast)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "training" / "launch"
SHELL_FILES = sorted(p for p in LAUNCH.iterdir() if p.suffix in (".sh", ".sbatch"))


def _train_flags() -> set[str]:
    """The long options of `jaxdllm train`, read from its sources (importing them imports jax)."""
    text = "".join((REPO / "jaxdllm" / f).read_text() for f in ("cli/train_command.py", "distributed.py"))
    return set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', text))


def check_train_command(argv: list[str], devices: int) -> dict:
    """`argv` is `jaxdllm train RECIPE --distributed ...` for a job of `devices` devices; returns
    the recipe with the command's `--set` overrides applied."""
    assert argv[:2] == ["jaxdllm", "train"], argv
    recipe_path = REPO / argv[2]
    assert argv[2].startswith("training/") and recipe_path.is_file(), argv[2]
    assert "--distributed" in argv
    flags = {a.split("=")[0] for a in argv[3:] if a.startswith("--")}
    assert flags <= _train_flags(), flags - _train_flags()
    workdir = argv[argv.index("--workdir") + 1]
    assert workdir.startswith("/"), "the work folder is a path on the shared filesystem"
    recipe = tomllib.loads(recipe_path.read_text())
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        assert section in recipe, f"--set {item}: the recipe has no [{section}]"
        recipe[section][name] = int(value) if value.isdigit() else value
    # the recipe's init_from is a placeholder local path: every host reads the model from shared storage
    assert any(s.startswith("model.init_from=") for s in sets)
    mesh, batch = recipe["mesh"], recipe["data"]["batch_size"]
    assert mesh["data"] * mesh["fsdp"] * mesh.get("tensor", 1) == devices, (mesh, devices)
    assert batch % (mesh["data"] * mesh["fsdp"] * recipe["optim"].get("grad_accum", 1)) == 0
    return recipe


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shell_files_parse(path):
    subprocess.run(["bash", "-n", str(path)], check=True, capture_output=True, text=True)


def test_each_cluster_has_its_file():
    assert {p.name for p in LAUNCH.iterdir()} >= {"tpu_pod.sh", "slurm.sbatch", "jobset.yaml", "README.md"}


def _tpu_dry_run(**env) -> list[list[str]]:
    out = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh")], env={**os.environ, "DRY_RUN": "1", **env},
                         check=True, capture_output=True, text=True).stdout
    return [shlex.split(line) for line in out.splitlines()]


def test_tpu_pod_runs_the_same_train_command_on_every_worker():
    commands = _tpu_dry_run(TPU_NAME="my-v5e-16", ZONE="us-west4-a", NFS_SHARE="10.0.0.2:/share")
    ssh = [c for c in commands if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]]
    assert ssh and all("--worker=all" in c and c[5] == "my-v5e-16" for c in ssh)
    remote = [c[c.index("--command") + 1] for c in ssh]
    for script in remote:  # what each worker runs is valid bash
        subprocess.run(["bash", "-n", "-c", script], check=True, capture_output=True, text=True)
    assert any("pip install" in s and "jax[tpu]" in s and "-e" in s for s in remote)
    assert any("mount -t nfs" in s and "10.0.0.2:/share" in s for s in remote)
    train = [s for s in remote if "jaxdllm train" in s]
    assert len(train) == 1
    argv = shlex.split(train[0][train[0].index("jaxdllm train"):])
    check_train_command(argv, devices=16)  # v5litepod-16: 16 chips


def test_tpu_pod_requires_its_variables():
    result = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh")], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k not in ("TPU_NAME", "ZONE")})
    assert result.returncode != 0 and "set TPU_NAME" in result.stderr


def _sbatch_directives() -> dict[str, str]:
    lines = (LAUNCH / "slurm.sbatch").read_text().splitlines()
    return dict(re.match(r"#SBATCH (--[a-z-]+)=(\S+)", line).groups() for line in lines if line.startswith("#SBATCH "))


def test_slurm_one_task_per_node_with_every_gpu(tmp_path):
    directives = _sbatch_directives()
    assert directives["--ntasks-per-node"] == "1"
    assert {"--nodes", "--gpus-per-node", "--time", "--output"} <= set(directives)
    # the batch script as SLURM runs it on 2 nodes of 8 GPUs, with `srun` writing what it was given
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "srun").write_text('#!/bin/bash\necho "$JAX_LOCAL_DEVICE_IDS" > "$SRUN_OUT"\n'
                               'printf "%s\\n" "$@" >> "$SRUN_OUT"\n')
    (venv / "srun").chmod(0o755)
    (venv / "activate").write_text(f'PATH="{venv}:$PATH"\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text("")
    out = tmp_path / "srun.txt"
    env = {**os.environ, "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_PER_NODE": "h100:8", "SLURM_SUBMIT_DIR": str(REPO),
           "VENV": str(venv.parent), "MODEL_DIR": str(tmp_path / "model"), "GSM8K_DIR": str(tmp_path / "gsm8k"),
           "WORKDIR": "/shared/runs/test", "SRUN_OUT": str(out)}
    subprocess.run(["bash", str(LAUNCH / "slurm.sbatch")], env=env, check=True, capture_output=True, text=True)
    device_ids, *srun_argv = out.read_text().splitlines()
    # JAX's SLURM detection would give each process only GPU SLURM_LOCALID
    assert device_ids == "0,1,2,3,4,5,6,7"
    assert "--ntasks-per-node=1" in srun_argv
    check_train_command(srun_argv[srun_argv.index("jaxdllm"):], devices=16)


# TPU topologies of the JobSet: chips in the slice and chips per host (v5e multi-host slices,
# v5p and v4 have 4 chips a host). v5e 4x4 = 16 chips = 4 hosts of 4 chips.
CHIPS_PER_HOST = {"tpu-v5-lite-podslice": 4, "tpu-v5p-slice": 4, "tpu-v4-podslice": 4, "tpu-v6e-slice": 4}


def _chips(topology: str) -> int:
    n = 1
    for side in topology.split("x"):
        n *= int(side)
    return n


def test_jobset_hosts_match_the_topology():
    jobset = yaml.safe_load((LAUNCH / "jobset.yaml").read_text())
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] >= 1
    (rjob,) = jobset["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert job["parallelism"] == job["completions"]
    assert job["completionMode"] == "Indexed"
    assert job["backoffLimit"] == 0  # a lost host fails the job, and the JobSet restarts all pods
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    accelerator = pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"]
    chips = _chips(pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"])
    (container,) = pod["containers"]
    per_host = int(container["resources"]["limits"]["google.com/tpu"])
    assert per_host == CHIPS_PER_HOST[accelerator]
    assert chips == job["parallelism"] * per_host
    argv = [str(a) for a in container["command"]]
    assert container["workingDir"] == "/app"
    check_train_command(argv, devices=chips)
    # the work folder lies on the shared volume
    workdir = argv[argv.index("--workdir") + 1]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert any(workdir.startswith(path.rstrip("/") + "/") and "persistentVolumeClaim" in volumes[name]
               for name, path in mounts.items())


def test_readme_names_each_file_and_the_local_trial():
    text = (LAUNCH / "README.md").read_text()
    for path in LAUNCH.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in text, path.name
    assert "jaxdllm launch -n 2 --devices-per-process 2 -- jaxdllm train tasks_tiny_cpu --workdir runs/two-hosts" in text
