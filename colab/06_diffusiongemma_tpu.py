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
# # DiffusionGemma on a Colab TPU
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/06_diffusiongemma_tpu.ipynb)
#
# Runtime → Change runtime type → TPU. The notebook plans the memory of
# `google/diffusiongemma-26B-A4B-it` (25B parameters, 3.8B active per token) on the TPU it finds,
# picks the mesh and the weights (bf16 over a v5e-8's chips, int8 on a v6e-1; a v5e-1 is too small
# even for int8 and the notebook says so before downloading), loads the checkpoint from the Hugging
# Face Hub, and generates with DiffusionGemma's published sampler: canvases of 256 uniformly random
# tokens, each denoised in at most 48 steps that accept the positions within an entropy bound and
# renoise the rest. It reports forwards, tokens per forward and tokens/s, and how they move with
# the step budget.
#
# Without an accelerator (as in this repository's tests) it runs the same cells at a small size:
# `tasks-diffusiongemma-tiny`, a DiffusionGemma-architecture model this project trained on a CPU
# (copy and reverse), 16-token canvases.

# %%
import os
import subprocess
import sys
from pathlib import Path

if "google.colab" in sys.modules:  # Colab: the repository (it holds the shipped models) and its install
    subprocess.run("git clone -q --depth 1 https://github.com/jaxdllm/jaxdllm /content/jaxdllm", shell=True, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/jaxdllm", "jax[tpu]",
                    "huggingface_hub"], check=True)
    sys.path.insert(0, "/content/jaxdllm")  # this kernel started before the install

try:  # local Jupyter (started in colab/ or anywhere in a checkout) without `pip install -e .`
    import jaxdllm  # noqa: F401
except ImportError:
    root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "jaxdllm" / "__init__.py").is_file()), None)
    if root is None:
        raise ImportError("jaxdllm is not installed: pip install -e \".[notebooks]\" in a clone of the repository")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))

# %%
import time

import jax

import jaxdllm
from jaxdllm import sharding

jaxdllm.enable_compilation_cache()  # compiled loops are kept on disk: a second session skips compiling
SMALL = jax.default_backend() == "cpu"
print("JAX", jax.__version__, "|", jax.device_count(), "x", jax.devices()[0].device_kind, "| small size:", SMALL)

# %% [markdown]
# ## Will it fit? The plan for this runtime, before anything is downloaded
# `jaxdllm.memory_plan` computes the bytes per device from the shapes and the sharding rules:
# weights (the experts shard over the `fsdp` axis), the encoder's KV cache over the prompt and the
# canvases (sliding and full layers each with their own K/V shape), and the canvas's float32 logits,
# their temperature-scaled copy (the next step's self-conditioning input) and probabilities. bf16
# weights are 47 GiB: no single chip holds them. int8 weights are 24.3 GiB: a v6e-1 (32 GiB) holds
# them with the decoding state, a v5e-1 (16 GiB) does not.

# %%
from jaxdllm.memory_plan import DeviceFacts, choose_decoding_setup

MODEL = "tasks-diffusiongemma-tiny" if SMALL else "google/diffusiongemma-26B-A4B-it"
if SMALL:
    config = jaxdllm.from_pretrained(MODEL).config
    G = config.block_size  # one 16-token canvas
else:
    config = jaxdllm.ModelConfig.preset(MODEL)  # the published shape
    G = 256
sampler = jaxdllm.SamplerConfig.preset("diffusiongemma", gen_length=G, block_length=config.block_size)
facts = DeviceFacts.of_this_machine()
setup = choose_decoding_setup(config, sampler, facts, prompt_len=128)
print(setup.plan.table())
print(setup.message)
if not setup.fits:  # stop here, with the reason, rather than in an out-of-memory error while loading
    raise SystemExit(setup.message)

# %% [markdown]
# ## The checkpoint
# On the TPU: `snapshot_download` (the only cell that reaches the network; the vision tower's
# tensors are skipped: jaxdllm runs the text model). On CPU: the shipped model, by name.

# %%
if SMALL:
    path = MODEL  # a shipped model loads by name
else:
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download(MODEL, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"]))
print(path)

# %% [markdown]
# ## Load onto every chip
# On the mesh the plan chose, in the weights it chose. Each tensor is read once and placed
# directly in its shard; with int8 it is quantized there. `jaxdllm.load` also returns the
# tokenizer (with the chat template) and the checkpoint's generation settings
# (`generation_config.json`: 48 steps, entropy bound 0.1, temperature 0.8 → 0.4, stop ids).

# %%
mesh = sharding.make_mesh(data=setup.mesh.data, fsdp=setup.mesh.fsdp, tensor=setup.mesh.tensor)
start = time.perf_counter()
model, tok, defaults = jaxdllm.load(path, mesh=mesh, **setup.load_kwargs)
print(f"{model.config.num_params:,} parameters loaded in {time.perf_counter() - start:.1f} s on mesh {dict(mesh.shape)}")
print(defaults)

prompts = ["reverse 4821=", "copy 2718="] if SMALL else ["Why is the sky blue? Answer in two sentences."]
batch = tok(prompts, chat=not SMALL)

# %% [markdown]
# ## Generate with the published sampler
# Timed on its second call (the first compiles the loop). NFE counts the denoiser's forwards of a
# row while it runs; the encoder's passes (the prompt, each finished canvas) are not counted, as
# published.

# %%
config = defaults.replace(gen_length=G)
out = jaxdllm.generate(model, batch, config)
start = time.perf_counter()
out = jaxdllm.generate(model, batch, config)
seconds = time.perf_counter() - start
answers = tok.answers(out)
tokens = int((out.generated != model.config.pad_token_id).sum())  # up to each row's stop id (pad after it)
for prompt, answer, nfe in zip(prompts, answers, out.nfe):
    print(f"{prompt!r} -> {answer[:300]!r}  ({nfe} forwards)")
print(f"{tokens / seconds:.1f} tokens/s, {tokens / out.nfe.sum():.2f} tokens per forward")

# %% [markdown]
# ## The step budget
# `max_denoising_steps` caps the denoising steps per canvas; the adaptive stop ends a canvas earlier
# once its argmax is stable and its mean entropy low. Fewer steps: fewer forwards, and at some point
# worse answers.

# %%
import matplotlib.pyplot as plt

budgets = [1, 2, 4, 16] if SMALL else [8, 16, 32, 48]
rows = []
for steps in budgets:
    result = jaxdllm.generate(model, batch, config.replace(max_denoising_steps=steps))
    rows.append((steps, float(result.nfe.mean()), tok.answers(result)))
    print(f"max_denoising_steps {steps:3d}: mean NFE {rows[-1][1]:5.1f}  {[a[:40] for a in rows[-1][2]]}")

fig, ax = plt.subplots(figsize=(4.5, 2.8))
ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-")
ax.set_xlabel("max_denoising_steps")
ax.set_ylabel("mean forwards per row")
ax.set_title(f"{MODEL}, {G} tokens", fontsize=9)
plt.tight_layout()
plt.show()
