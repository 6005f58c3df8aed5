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
# # LLaDA-8B-Instruct on a Colab TPU
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/02_llada8b_tpu.ipynb)
#
# Runtime → Change runtime type → TPU. The notebook downloads `GSAI-ML/LLaDA-8B-Instruct` from the
# Hugging Face Hub (16 GB in bf16), places it over every TPU chip with a `(data, fsdp, tensor)`
# mesh, and decodes a chat prompt with three published samplers: LLaDA's one token per step,
# Fast-dLLM's dual cache, and dParallel's entropy threshold. It reports NFE and tokens/s.
#
# Without an accelerator (as in this repository's tests) it runs the same cells at a small size:
# a tiny random LLaDA checkpoint written by the notebook itself, 32 generated tokens. Its text is
# noise; the cells, shapes and mesh are the real ones.

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
import json
import time
from pathlib import Path

import jax
from flax import nnx

import jaxdllm
from jaxdllm import sharding

jaxdllm.enable_compilation_cache()  # compiled loops are kept on disk: a second session skips compiling
SMALL = jax.default_backend() == "cpu"
print("JAX", jax.__version__, "|", jax.device_count(), "x", jax.devices()[0].device_kind, "| small size:", SMALL)

# %% [markdown]
# ## Will it fit? The plan for this runtime, before anything is downloaded
# `jaxdllm.memory_plan` computes the bytes per device from the model's shapes and the sharding
# rules: weights, the dual cache's K/V, logits and activations. It picks the mesh (tensor
# parallel over every chip when the heads divide) and the weights: bf16 where they fit, else
# weight-only int8 (`quantization="int8"`), and says so when the runtime is too small even then.
# LLaDA-8B's bf16 weights alone are 14.9 GiB, more than a v5e-1 (16 GiB) can hold beside the
# decoding state; in int8 they are 7.95 GiB and the whole plan is 8.3 GiB. A v6e-1 (32 GiB),
# the v2-8 and a v5e-8 run bf16.

# %%
from jaxdllm.memory_plan import DeviceFacts, choose_decoding_setup

G, B = (32, 16) if SMALL else (256, 32)  # generated tokens and block length
if SMALL:
    config = jaxdllm.ModelConfig.preset("tiny-llada", vocab_size=101, mask_token_id=3, eos_token_id=2,
                                        eot_token_id=2, pad_token_id=0, bos_token_id=1)
else:
    config = jaxdllm.ModelConfig.preset("llada-8b")  # LLaDA-8B-Instruct's architecture
facts = DeviceFacts.of_this_machine()
setup = choose_decoding_setup(config, jaxdllm.SamplerConfig.preset("fast-dllm-dual", gen_length=G, block_length=B),
                              facts, prompt_len=128)
print(setup.plan.table())
print(setup.message)
if not setup.fits:  # stop here, with the reason, rather than in an out-of-memory error while loading
    raise SystemExit(setup.message)

# %% [markdown]
# ## The checkpoint
# On the TPU: `snapshot_download` (the only cell that reaches the network). On CPU: a tiny random
# LLaDA in the same Hugging Face layout, with the character tokenizer and a chat template.

# %%
if SMALL:
    from jaxdllm.data import save_char_tokenizer

    path = Path("runs/notebook-tiny-llada")
    jaxdllm.save_pretrained(jaxdllm.Transformer(config, rngs=nnx.Rngs(0)), path)
    save_char_tokenizer(path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                                         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
else:
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download("GSAI-ML/LLaDA-8B-Instruct", allow_patterns=["*.json", "*.safetensors", "*.py",
                                                                                "*.jinja", "*.txt"]))
print(path)

# %% [markdown]
# ## Load onto every chip
# On the mesh the plan chose (LLaDA-8B's 32 heads divide 8 chips: 1.9 GiB of weights per chip on a
# v5e-8 or v2-8), in the weights it chose. Each tensor is read once and placed directly in its
# shard; with int8 it is quantized there, so the bf16 model is never held.

# %%
mesh = sharding.make_mesh(data=setup.mesh.data, fsdp=setup.mesh.fsdp, tensor=setup.mesh.tensor)
start = time.perf_counter()
model = jaxdllm.from_pretrained(path, mesh=mesh, **setup.load_kwargs)
tok = jaxdllm.Tokenizer.from_pretrained(path)
print(f"{model.config.num_params:,} parameters loaded in {time.perf_counter() - start:.1f} s on mesh {dict(mesh.shape)}")

question = "Lily can run 12 kilometers per hour for 4 hours. After that, she runs 6 kilometers per hour. How many kilometers can she run in 8 hours?"
ids = tok([question], chat=True).ids  # the chat template, as token ids [1, Lp]
print(ids.shape[1], "prompt tokens")

# %% [markdown]
# ## Three samplers
# Published settings: 256 tokens in blocks of 32 (small size: 32 in blocks of 16). Each is
# timed on its second call (the first compiles the loop).

# %%
configs = {
    "llada": jaxdllm.SamplerConfig.preset("llada", gen_length=G, block_length=B, steps=G),
    "fast-dllm-dual": jaxdllm.SamplerConfig.preset("fast-dllm-dual", gen_length=G, block_length=B),
    "dparallel": jaxdllm.SamplerConfig.preset("dparallel", gen_length=G, block_length=B),
}
rows = []
for name, config in configs.items():
    start = time.perf_counter()
    jaxdllm.generate(model, ids, config)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jaxdllm.generate(model, ids, config)
    seconds = time.perf_counter() - start
    text = tok.answers(out)[0]  # up to the first EOS
    rows.append((name, int(out.nfe[0]), G / seconds, compile_s, text))
print(f"{'sampler':16s} {'NFE':>5s} {'tokens/s':>9s} {'first call s':>13s}")
for name, nfe, tps, compile_s, _ in rows:
    print(f"{name:16s} {nfe:5d} {tps:9.1f} {compile_s:13.1f}")
for name, *_, text in rows:
    print(f"\n[{name}] {text[:300]!r}")

# %%
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.8))
names = [r[0] for r in rows]
left.bar(names, [r[1] for r in rows], color="C0")
left.set_ylabel("forwards (NFE)")
right.bar(names, [r[2] for r in rows], color="C1")
right.set_ylabel("tokens/s")
fig.suptitle(f"{'tiny random LLaDA (CPU size)' if SMALL else 'LLaDA-8B-Instruct'}, {G} tokens, batch 1", fontsize=9)
plt.tight_layout()
plt.show()
