"""A tiny LLaDA-layout checkpoint with confident predictions, shared by the sampler tests."""

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

import jaxdllm
from support.llada_reference import TINY, make_llada_checkpoint

HEAD_SCALE = 15.0  # peaked logits: the parallel policies commit 1 to many tokens per step
MASK_ID, EOS_ID = TINY["mask_token_id"], TINY["eos_token_id"]


def tiny_llada(path: Path):
    """(jaxdllm model, torch weights, config dict) for a fresh checkpoint under `path`."""
    weights = make_llada_checkpoint(path, head_scale=HEAD_SCALE)
    return jaxdllm.from_pretrained(path), weights, dict(TINY)


@functools.cache
def shared_tiny_llada():
    """`(model, weights, config dict, path)` of one checkpoint written once per test run, for
    tests that only read the model (the same weights as `tiny_llada`, which gives a fresh one)."""
    root = Path(tempfile.mkdtemp(prefix="jaxdllm-tests-"))  # holds nothing else: tests look beside the model
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    path = root / "llada"
    return (*tiny_llada(path), path)


def prompts(lengths, seed=0, vocab=120):
    """Left-padded `[B, max(lengths)]` ids and mask, plus the unpadded rows."""
    rng = np.random.RandomState(seed)
    rows = [rng.randint(0, vocab, (n,)) for n in lengths]
    width = max(lengths)
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return ids, mask, rows
