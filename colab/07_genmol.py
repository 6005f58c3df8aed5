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
# # GenMol: molecules from a masked diffusion model
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdllm/jaxdllm/blob/main/colab/07_genmol.ipynb)
#
# GenMol (NVIDIA, 2025) writes a molecule as a SAFE string (fragments joined by attachment digits, itself a
# valid SMILES) and generates it with a BERT-style masked diffusion model, one token per step by confidence.
# The same model designs new molecules, completes given fragments (motif extension, scaffold decoration,
# linkers, superstructures) and optimises against an oracle by remasking fragments. This notebook runs the
# shipped `moses-bert-small-genmol` (6 layers of 128, trained on 200,000 MOSES molecules on a CPU) through
# each: SMILES in, SMILES out. On a TPU or GPU runtime it draws more samples.

# %%
import os
import subprocess
import sys
from pathlib import Path

if "google.colab" in sys.modules:  # Colab: the repository (it holds the shipped models) and its install
    subprocess.run("git clone -q --depth 1 https://github.com/jaxdllm/jaxdllm /content/jaxdllm", shell=True, check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/jaxdllm[molecules]"], check=True)
    sys.path.insert(0, "/content/jaxdllm")  # this kernel started before the install

try:  # local Jupyter (started in colab/ or anywhere in a checkout) without `pip install -e .`
    import jaxdllm  # noqa: F401
except ImportError:
    root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "jaxdllm" / "__init__.py").is_file()), None)
    if root is None:
        raise ImportError("jaxdllm is not installed: pip install -e \".[molecules,notebooks]\" in a clone of the repository")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))

# %%
import jax
from IPython.display import Image, display

from jaxdllm.molecules import Designer
from jaxdllm.molecules.drawing import draw_grid
from jaxdllm.molecules.metrics import denovo_metrics

SMALL = jax.default_backend() == "cpu"
TEST = os.environ.get("JAXDLLM_NOTEBOOK_SIZE") == "test"  # the test suite's run: the same cells, smaller still
N = 16 if TEST else 64 if SMALL else 1000
OUT = Path("runs/notebook-genmol")
OUT.mkdir(parents=True, exist_ok=True)
designer = Designer.load("moses-bert-small-genmol", batch_size=min(N, 256))
print(jax.default_backend(), "samples per task:", N)

# %% [markdown]
# ## 1. De novo design
# Each sample is a canvas `[CLS] [MASK]*n [SEP]` with n drawn from the training set's lengths (at least 40),
# decoded one token per step: the token with the highest sampled confidence plus annealed Gumbel noise
# (GenMol's T 0.5, r 0.5). Validity, uniqueness, quality (QED >= 0.6 and SA <= 4) and diversity as GenMol
# defines them.

# %%
samples = designer.denovo(N, seed=0)
print(samples.safe[0], "->", samples.smiles[0])
print({k: round(v, 3) if isinstance(v, float) else v for k, v in denovo_metrics(samples.smiles).items()})
display(Image(str(draw_grid(samples.valid()[:10], OUT / "denovo.png")), width=900))

# %% [markdown]
# ## 2. Fragment-constrained design
# The fragment's SAFE string leaves an attachment digit open; the masks after it write the rest of the
# molecule, and only molecules that contain the fragment are kept. Linker design takes two steps, as
# published: each fragment grows on its own, and the linker cut from each grown molecule joins the two
# (`one_step=True`: both fragments in one canvas, the masks between them).

# %%
motif = designer.motif_extension("[*]c1ccc(Cl)cc1", N, seed=1)
linked = designer.linker("[*]c1ccccc1.[*]N1CCOCC1", N, seed=2)
for name, out in (("motif extension", motif), ("linker design", linked)):
    print(f"{name}: {len(out.valid())} of {N} contain the fragment; e.g. {out.valid()[:3]}")
display(Image(str(draw_grid(motif.valid()[:5] + linked.valid()[:5], OUT / "fragments.png")), width=900))

# %% [markdown]
# ## 3. Fragment remasking against an oracle
# GenMol's goal-directed loop: a population of fragments scored by the oracle, joined in pairs; the model
# remasks one fragment of each joined molecule (5-15 masks) and rewrites it. Here the oracle is the ECFP4
# similarity to celecoxib, against random sampling from the same model with the same number of oracle calls.

# %%
from jaxdllm.molecules.moses import read_pairs, shipped_data_dir  # noqa: E402
from jaxdllm.molecules.oracles import oracle  # noqa: E402
from jaxdllm.molecules.remasking import RemaskingConfig, fragment_remasking, random_sampling  # noqa: E402

budget = 64 if TEST else 300 if SMALL else 2000
reference = [s for s, _ in read_pairs(shipped_data_dir() / "train.tsv.gz")[:300 if TEST else 2000]]
score = oracle("celecoxib_rediscovery")
remasked = fragment_remasking(designer, score, "celecoxib_rediscovery", budget, reference,
                              config=RemaskingConfig(warmup=budget // 5, batch_size=16), seed=0)
sampled = random_sampling(designer, score, budget, seed=0)
for name, run in (("fragment remasking", remasked), ("random sampling", sampled)):
    print(f"{name}: AUC top-10 {run['auc_top10']:.3f}, best {run['best']['score']:.3f} {run['best']['smiles']}")

# %% [markdown]
# ## GenMol's released weights
# `python -m jaxdllm.models.families.bert.genmol_checkpoint model.ckpt genmol-v1` converts GenMol's
# Lightning checkpoint (its EMA weights) to a folder `Designer.load` reads, with GenMol's 1,880-token SAFE
# tokenizer saved beside it (`--tokenizer DIR`) and a `lengths.json` of your data.
