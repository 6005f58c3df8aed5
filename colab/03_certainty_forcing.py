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
# # Certainty-forcing distillation (dParallel) at tiny scale
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/03_certainty_forcing.ipynb)
#
# dParallel distils a masked-diffusion model into one that is confident early, so that its
# entropy-threshold sampler commits many tokens per forward. Three commands, as in the README:
# the teacher (the shipped `checkpoints/tasks-llada-small`) answers prompts and keeps the checked
# ones; the student trains on them with the certainty-forcing loss; `jaxdllm eval` sweeps the
# entropy threshold on the model before and after. Without an accelerator the notebook runs a
# few hundred teacher answers and 30 training steps of 16 rows (two CPU minutes), which moves the
# model only a little; the full recipe (24,000 answers, 1,500 steps) gave the shipped
# `checkpoints/tasks-llada-small-dparallel`, whose plot closes the notebook.

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
import json
import shutil
from pathlib import Path

import jax
import matplotlib.pyplot as plt
from IPython.display import Image, display

import jaxdllm

SMALL = jax.default_backend() == "cpu"
TEST = os.environ.get("JAXDLLM_NOTEBOOK_SIZE") == "test"  # the test suite's run: the same cells, smaller still
RUN = Path("runs/notebook-dparallel")
shutil.rmtree(RUN, ignore_errors=True)
RECIPE = "dparallel_tasks_tiny_cpu"  # a shipped recipe by name (training/dparallel_tasks_tiny_cpu.toml)
size = ["--set", f"distill.examples_per_task={8 if TEST else 40}"] if SMALL else []
steps = ["--steps", "10" if TEST else "30", "--set", "data.batch_size=16"] if SMALL else []
print("small size:", SMALL)


def jaxdllm_cli(*args):
    """Run a `jaxdllm` command and show its output (the same as `!jaxdllm ...` in a cell)."""
    result = subprocess.run([sys.executable, "-m", "jaxdllm.cli", *args], capture_output=True, text=True)
    print(result.stdout[-3000:])
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])


# %% [markdown]
# ## 1. The teacher's checked answers
# The shipped model decodes each prompt one token per step; each answer is checked by its task's
# checker, and only the right ones are kept (batched, resumable, sharded over the data axes).

# %%
jaxdllm_cli("distill", "generate", RECIPE, "--out", str(RUN / "teacher.jsonl"), "--no-progress", *size)
print(open(RUN / "teacher.jsonl").readline()[:300])

# %% [markdown]
# ## 2. Certainty-forcing training
# Two complementary masked views of the answer block; cross-entropy on the masked tokens plus
# the entropy of the predictions that are already right (temperature 0.5, weight 2).

# %%
jaxdllm_cli("train", RECIPE, "--workdir", str(RUN), "--export", str(RUN / "model"), *steps,
        "--set", f"data.path={RUN / 'teacher.jsonl'}", "--set", "log.progress=false", "--set", "log.every=5")
metrics = [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]
print({k: round(v, 4) for k, v in metrics[-1].items() if isinstance(v, float)})

# %% [markdown]
# ## 3. Before and after: accuracy against tokens per forward
# The same entropy-threshold sweep on the teacher and on the student.

# %%
tasks, n = ("copy,sort,add,perm", "8" if TEST else "50") if SMALL else ("suite", "200")
sweep = "entropy_threshold=0.1,0.5" if TEST else "entropy_threshold=0.1,0.2,0.35,0.5"
for name, model in (("before", "tasks-llada-small"), ("after", str(RUN / "model"))):
    jaxdllm_cli("eval", "--model", model, "--preset", "dparallel", "--sweep", sweep, "--tasks", tasks, "--n", n,
            "--out", str(RUN / f"eval-{name}"), "--no-progress")

# %%
reports = {name: json.loads((RUN / f"eval-{name}" / "eval.json").read_text()) for name in ("before", "after")}
panels = list(next(iter(reports["before"]["results"].values())))
fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3))
for ax, panel in zip(axes, panels):
    for name, report in reports.items():
        points = [(r[panel]["answer_tokens_per_forward"], 100 * r[panel]["accuracy"]) for r in report["results"].values()]
        ax.plot(*zip(*points), "o-", label=name)
    ax.set_title(panel)
    ax.set_xlabel("answer tokens / forward")
axes[0].set_ylabel("accuracy (%)")
axes[0].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The full recipe's result
# `checkpoints/tasks-llada-small-dparallel` (its card has the table): 92.0 % over the suite at
# 2.51 forwards per answer with entropy threshold 0.2, against 87.9 % for its teacher with the
# same sampler.

# %%
display(Image(str(jaxdllm.checkpoint_dir("tasks-llada-small-dparallel") / "pareto.png"), width=900))
