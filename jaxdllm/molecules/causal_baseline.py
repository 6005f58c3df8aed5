"""The causal side of GenMol's comparison (SAFE-GPT's role): a causal model over the same SAFE strings,
sampled autoregressively with temperature from `[CLS]` until `[SEP]`, decoded back through SAFE the
same way as the masked model's samples.

    from jaxdllm.molecules.causal_baseline import CausalDesigner
    CausalDesigner.load("moses-qwen2-small-causal").denovo(8, temperature=1.0)

Decoding is the one compiled loop's autoregressive mode (`jacobi` with a window of 1: one token per
forward from a KV cache, each sampled at `temperature`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from jaxdllm.decoding import SamplerConfig
from jaxdllm.molecules.bracket_safe import check_format, from_format, read_safe_format
from jaxdllm.molecules.design import Samples
from jaxdllm.molecules.safe_text import safe_to_smiles


@dataclasses.dataclass
class CausalDesigner:
    """A causal model over SAFE strings. `max_tokens`: the longest molecule it may write (SAFE tokens
    plus `[SEP]`); `batch_size`: rows per compiled call; `safe_format`: `"safe"` or `"bracket"` (GenMol V2's
    attachments, `jaxdllm.molecules.bracket_safe`)."""

    model: object
    tokenizer: object
    max_tokens: int = 68
    batch_size: int = 64
    safe_format: str = "safe"

    def __post_init__(self):
        from jaxdllm.decoding.sampler import Sampler

        check_format(self.safe_format)
        self.sampler = Sampler(self.model)

    @classmethod
    def load(cls, path: str | Path, **options) -> "CausalDesigner":
        """A checkpoint folder or shipped name (its `safe_format.json` gives the text format)."""
        import jaxdllm
        from jaxdllm.shipped import checkpoint_dir

        pretrained = jaxdllm.load(path)
        options.setdefault("max_tokens", pretrained.model.config.max_position - 4)
        options.setdefault("safe_format", read_safe_format(checkpoint_dir(path)))
        return cls(pretrained.model, pretrained.tokenizer, **options)

    def denovo(self, n: int, *, temperature: float = 1.0, seed: int = 0) -> Samples:
        """`n` molecules sampled from `[CLS]` at `temperature` (0: greedy, one molecule)."""
        bos = self.tokenizer.token_to_id(self.tokenizer.special_tokens["bos_token"])
        config = SamplerConfig(gen_length=self.max_tokens, policy="jacobi", window=1, temperature=temperature,
                               stop_at_eos=True, prompt_bucket=1)
        texts, nfe = [], []
        key = jax.random.key(seed)
        for start in range(0, n, self.batch_size):
            rows = min(self.batch_size, n - start)
            ids = np.full((self.batch_size, 1), bos, np.int32)  # one compiled shape for every chunk
            out = self.sampler(ids, config, np.ones_like(ids), key=jax.random.fold_in(key, start))
            texts += self.tokenizer.answers(out)[:rows]
            nfe += [int(x) for x in np.asarray(out.nfe)[:rows]]
        smiles = [safe_to_smiles(from_format(t, self.safe_format)) for t in texts]
        return Samples(smiles, texts, nfe, self.safe_format)


__all__ = ["CausalDesigner"]
