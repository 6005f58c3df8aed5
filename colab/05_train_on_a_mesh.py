# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Training a diffusion LM on a mesh: a recipe, checkpoints, resume
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/05_train_on_a_mesh.ipynb)
#
# A TOML recipe (`training/tasks_tiny_cpu.toml`: masked-diffusion SFT of a small LLaDA on the
# synthetic task suite) trained on a `(data, fsdp, tensor)` mesh over every device, with orbax
# checkpoints; the run is stopped and a new trainer resumes it exactly where it stopped. On a
# TPU the mesh spans its chips; without an accelerator the notebook gives itself 8 CPU devices
# and trains a few dozen steps (a few CPU minutes).

# %%
import os
import subprocess
import sys
from pathlib import Path

if "google.colab" in sys.modules:  # Colab: the repository (it holds the shipped models) and its install
    subprocess.run("git clone -q --depth 1 https://github.com/jaxdllm/jaxdllm /content/jaxdllm", shell=True, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/jaxdllm"], check=True)
    sys.path.insert(0, "/content/jaxdllm")  # this kernel started before the install

try:  # local Jupyter (started in colab/ or anywhere in a checkout) without `pip install -e .`
    import jaxdllm  # noqa: F401
except ImportError:
    root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "jaxdllm" / "__init__.py").is_file()), None)
    if root is None:
        raise ImportError("jaxdllm is not installed: pip install -e \".[notebooks]\" in a clone of the repository")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
if not any(os.path.exists(d) for d in ("/dev/accel0", "/dev/vfio", "/dev/nvidia0")):
    # No accelerator: 8 CPU devices, so that the mesh below is a real (2, 2, 2) one. Set before JAX starts.
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    # XLA's partitioner warns about resharding the embedding gather on these fake devices; quiet it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# %%
import json
import shutil
from pathlib import Path

import jax
import matplotlib.pyplot as plt

import jaxdllm
from jaxdllm.train import TrainConfig, Trainer

jaxdllm.enable_compilation_cache()  # compiled loops are kept on disk: a second session skips compiling
SMALL = jax.default_backend() == "cpu"
print("JAX", jax.__version__, "|", jax.device_count(), "x", jax.devices()[0].device_kind, "| small size:", SMALL)

# %% [markdown]
# ## The recipe, with a mesh
# Every section of the TOML is a validated dataclass; a wrong key or value is an error naming it.
# `fsdp` shards parameters and optimizer state, `tensor` splits heads and MLP, `data` splits rows.

# %%
raw = TrainConfig.from_toml("tasks_tiny_cpu").to_dict()  # a shipped recipe by name (training/tasks_tiny_cpu.toml)
n = jax.device_count()
raw["mesh"] = {"data": 2, "fsdp": 2, "tensor": 2} if n == 8 else {"data": 1, "fsdp": n, "tensor": 1}
raw["train"]["steps"] = 40 if SMALL else 1000
raw["checkpoint"]["every"] = 10 if SMALL else 250
raw["log"].update(every=5 if SMALL else 50, progress=False)
config = TrainConfig.from_dict(raw)
print({k: raw[k] for k in ("model", "mesh", "train", "checkpoint")})

workdir = Path("runs/notebook-mesh")
shutil.rmtree(workdir, ignore_errors=True)

# %% [markdown]
# ## Train half of the run, then stop

# %%
trainer = Trainer(config, workdir=workdir)
print("mesh", dict(trainer.mesh.shape))
half = config.train.steps // 2
history = trainer.train(stop_at=half)
print(f"stopped at step {trainer.step}: loss {history[-1]['loss']:.3f}")
trainer.close()
print("checkpoints at steps", sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()))

# %% [markdown]
# ## A new trainer resumes from the latest checkpoint
# Parameters, optimizer state and the data iterator's position come back; the second half
# continues the first.

# %%
trainer = Trainer(config, workdir=workdir)
assert trainer.restore()
print("resumed at step", trainer.step)
history = trainer.train()
print(f"finished at step {trainer.step}: loss {history[-1]['loss']:.3f}")
model_dir = trainer.export(workdir / "model")
trainer.close()
print("exported", model_dir)

# %%
metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
steps = [m["step"] for m in metrics if "loss" in m]
plt.figure(figsize=(5, 3))
plt.plot(steps, [m["loss"] for m in metrics if "loss" in m], "o-")
plt.axvline(half, color="gray", ls="--", label="stop / resume")
plt.xlabel("step")
plt.ylabel("masked-diffusion loss")
plt.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The exported folder is a Hugging Face checkpoint: `jaxdllm generate --model runs/notebook-mesh/model
# --prompt "copy 2718="` decodes with it. A usable model of this size takes the GPU recipe
# (`training/tasks_small_gpu.toml`); the shipped `checkpoints/tasks-llada-small` is its result.
