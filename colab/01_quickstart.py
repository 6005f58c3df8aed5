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
# # jaxdllm quickstart: decoding many tokens per forward
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/01_quickstart.ipynb)
#
# The shipped model `checkpoints/tasks-llada-small` (6.9M parameters, a masked-diffusion LM
# trained by this project on its synthetic digit tasks) decodes a batch of prompts with several
# samplers side by side: LLaDA's one token per step, Fast-dLLM's confidence threshold, and
# dParallel's entropy threshold on the distilled model. Then the order in which each answer
# token was decided, and the canvas of one prompt step by step. Runs on CPU in about a minute.

# %%
import os
import subprocess
import sys
from pathlib import Path

if "google.colab" in sys.modules:  # Colab: the repository (it holds the shipped models) and its install
    subprocess.run("git clone -q --depth 1 https://github.com/jaxdllm/jaxdllm /content/jaxdllm", shell=True, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/jaxdllm[eval]"], check=True)
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
import matplotlib.pyplot as plt

import jaxdllm
from jaxdllm.tokenizer import answer_length

jaxdllm.enable_compilation_cache()  # compiled loops are kept on disk: a second session skips compiling
print("JAX", jax.__version__, "on", jax.default_backend())
# Shipped models load by name from any working folder; `defaults` is the checkpoint's own sampler.
model, tok, defaults = jaxdllm.load("tasks-llada-small")
distilled, _, _ = jaxdllm.load("tasks-llada-small-dparallel", dtype="float32")
prompts = ["reverse 4821=", "sort 93715=", "copy 2718=", "123+456=", "perm 4312=", "pick 3 from 31425="]
batch = tok(prompts)  # left-padded ids and attention mask
ids, mask = batch.ids, batch.mask
EOS = model.config.eos_token_id
print(ids.shape, "left-padded prompt ids;", "checkpoint defaults:", defaults.gen_length, "tokens,", defaults.policy)

# %% [markdown]
# ## Several samplers on one batch
# Each call is one `jax.jit` holding one `jax.lax.while_loop`. The first call of a shape compiles;
# the time below is the second call.

# %%
G = defaults.gen_length  # 16: presets rescale their block length and steps to it
samplers = {
    "llada, 1 token/step": (model, defaults),
    "fast-dllm threshold 0.9": (model, jaxdllm.SamplerConfig.preset("fast-dllm-parallel", gen_length=G)),
    "dparallel (distilled) entropy 0.2": (distilled, jaxdllm.SamplerConfig.preset(
        "dparallel", gen_length=G, entropy_threshold=0.2)),
}
results = {}
print(f"{'sampler':36s} {'ms':>6s}  " + "  ".join(f"{p[:12]:>12s}" for p in prompts))
for name, (m, config) in samplers.items():
    jaxdllm.generate(m, ids, config, attention_mask=mask)  # compile
    start = time.perf_counter()
    out = jaxdllm.generate(m, ids, config, attention_mask=mask)
    ms = 1000 * (time.perf_counter() - start)
    results[name] = out
    answers = tok.answers(out)  # each answer up to its EOS
    print(f"{name:36s} {ms:6.0f}  " + "  ".join(f"{a:>8s} ({n:2d})" for a, n in zip(answers, out.nfe)))
print("(answer, forwards per prompt)")

# %% [markdown]
# ## Decoding order
# `commit_step[b, i]` is the step at which position i was decided. One token per step decides
# the answer left to right here; the threshold samplers decide most single-answer prompts in
# their first forward, and the many-answer prompts (perm, pick3) one token at a time.

# %%
fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.2))
for ax, (name, out) in zip(axes, results.items()):
    steps = out.commit_step[:, ids.shape[1]:].astype(float)
    tokens = out.tokens[:, ids.shape[1]:]
    width = max(answer_length(row, EOS) for row in tokens)
    ax.imshow(steps[:, :width], cmap="viridis", aspect="auto")
    for b in range(len(prompts)):
        for i in range(width):
            ax.text(i, b, tok.decode([int(tokens[b, i])]) or "·", ha="center", va="center", color="white", fontsize=8)
    ax.set_yticks(range(len(prompts)), [p[:14] for p in prompts], fontsize=7)
    ax.set_xlabel("answer position")
    ax.set_title(f"{name}\nNFE {out.nfe.tolist()}", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## One prompt, step by step
# `max_trajectory` records the canvas after each step (`_` is a masked position).

# %%
one = tok("sort 93715=").ids
out = jaxdllm.generate(model, one, defaults.replace(max_trajectory=G))
for step, canvas in enumerate(out.trajectory[0]):
    cells = ["_" if t == model.config.mask_token_id else (tok.decode([int(t)]) or "·") for t in canvas[one.shape[1]:]]
    print(f"step {step + 1:2d}  {''.join(cells)}")
print("answer:", tok.answers(out)[0])
