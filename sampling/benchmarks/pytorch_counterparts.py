"""The PyTorch decoders people run today, on a jaxdllm model's weights (handed over in memory by
`torch_handover`), each as `build(model, device) -> decode` with `decode(ids [B, Lp]) ->
(tokens [B, G] numpy, forwards of the batch)`:

* `fast_dllm` — the published Fast-dLLM code for LLaDA (NVlabs/Fast-dLLM, `llada/generate.py`
  and its `LLaDAModelLM`), read at run time from a checkout the caller names; nothing of it is
  stored here. `generate` (one token per step when `steps = gen_length`) and
  `generate_with_dual_cache` (threshold). The published functions build the canvas for one
  prompt (`torch.full((1, ...))`); the text loaded is changed in that one place to take the
  prompts' batch (`prompt.shape[0]` rows), which the rest of `generate` already handles. The
  published model's dual-cache update (`past_key[:, :, replace_indices] = k`, the indices of
  every row together) holds for one row only, so `generate_with_dual_cache` decodes a batch one
  prompt after another, as its users do.
* `hf_greedy` — transformers' `generate(do_sample=False)` of the causal model (its KV cache;
  exactly `gen_length` tokens: no stop id).
* `hf_diffusiongemma` — transformers' `DiffusionGemmaForBlockDiffusion.generate` with the
  published sampler settings, fed the canvas draws jaxdllm makes and answering its multinomial
  by the argmax (`diffusiongemma_speed.shared_draws`): both sides then do the same work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxdllm.checkpoint import config_to_hf
from sampling.benchmarks.torch_handover import tied_names, torch_module, torch_state_dict, unset_parameters

# The one line of the published LLaDA loops that fixes the batch at one prompt.
_ONE_PROMPT = re.compile(r"torch\.full\(\(1, prompt\.shape\[1\] \+ gen_length\)")
_BATCHED = "torch.full((prompt.shape[0], prompt.shape[1] + gen_length)"


def llada_folder(root: str | Path) -> Path:
    """The `llada` folder of a Fast-dLLM checkout `root` (or `root` itself if it is that folder)."""
    root = Path(root)
    return root if (root / "generate.py").is_file() else root / "llada"


def source_digests(root: str | Path) -> dict:
    """sha256 of the published files read (`generate.py`, `model/modeling_llada.py`): which
    version of the published code a result ran."""
    llada = llada_folder(root)
    return {name: hashlib.sha256((llada / name).read_bytes()).hexdigest()
            for name in ("generate.py", "model/modeling_llada.py") if (llada / name).is_file()}


def llada_code(root: str | Path) -> types.ModuleType:
    """Fast-dLLM's `llada/generate.py` as a module (its batch opened, see the module docstring),
    with `LLaDAConfig` and `LLaDAModelLM` from its `llada/model`. `root`: the Fast-dLLM checkout
    (or its `llada` folder)."""
    llada = llada_folder(root)
    source_file = llada / "generate.py"
    if not source_file.is_file():
        raise FileNotFoundError(f"{source_file} not found: pass a Fast-dLLM checkout (git clone "
                                f"https://github.com/NVlabs/Fast-dLLM)")
    text, count = _ONE_PROMPT.subn(_BATCHED, source_file.read_text())
    if count != 3:
        raise ValueError(f"{source_file}: expected the canvas line in generate, generate_with_prefix_cache and "
                         f"generate_with_dual_cache, found {count}: another version of the published code")
    if str(llada) not in sys.path:
        sys.path.insert(0, str(llada))  # its `from model.modeling_llada import ...`
    module = types.ModuleType("fast_dllm_generate")
    module.__file__ = str(source_file)
    exec(compile(text, str(source_file), "exec"), module.__dict__)
    from model.configuration_llada import LLaDAConfig

    module.LLaDAConfig = LLaDAConfig
    return module


def llada_config_json(config) -> dict:
    """LLaDA-8B's config.json at `config`'s shape: the OLMo keys `config_to_hf` writes plus the ones
    the published model reads with defaults unlike LLaDA's (SwiGLU through silu on `ff_proj`,
    RMSNorm, RoPE in fp32, no dropout, no fused attention kernel)."""
    raw = config_to_hf(config)
    raw.update(activation_type="silu", layer_norm_type="rms", rope=True, rope_full_precision=True,
               alibi=False, attention_layer_norm=False, scale_logits=False, input_emb_norm=False,
               flash_attention=False, attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0,
               mask_token_id=config.mask_token_id, eos_token_id=config.eos_token_id,
               pad_token_id=config.pad_token_id, init_device="meta", use_cache=False)
    return raw


ONE_PROMPT_LOOPS = ("generate_with_dual_cache",)  # see the module docstring


@dataclasses.dataclass(frozen=True)
class Counterpart:
    """A PyTorch decoder: `factory(config)` gives the function that makes its model (parameters
    unset), `unused` the name prefixes of its parameters the decoder never runs (zeros), and
    `decoder(torch_model, config, device)` the `decode` function."""

    factory: Callable
    decoder: Callable
    unused: tuple[str, ...] = ()

    def __call__(self, model, device: str):
        """`decode` on a PyTorch model holding `model`'s weights (handed over in memory)."""
        torch_model = torch_module(self.factory(model.config), torch_state_dict(model), device, unused=self.unused)
        return self.decoder(torch_model, model.config, device)

    def name_mismatches(self, config) -> list[str]:
        """What the handover of a `config` model would not fit (empty: every parameter of the PyTorch
        model gets a checkpoint tensor, tied or unused ones aside, and every tensor a parameter),
        on unset parameters: nothing is allocated, so the published shapes are checked on any
        machine."""
        from jaxdllm.checkpoint.hf_names import tensor_table

        with unset_parameters("cpu"):
            module = self.factory(config)()
        theirs = set(module.state_dict())
        ours = {t.name for t in tensor_table(config)}
        missing = sorted(n for n in theirs - ours - tied_names(module) if not (self.unused and n.startswith(self.unused)))
        return [f"no weights for {n}" for n in missing[:5]] + [f"no place for {n}" for n in sorted(ours - theirs)[:5]]


def fast_dllm(root: str | Path, loop: str, *, gen_length: int, block_length: int, threshold: float | None):
    """The published Fast-dLLM loop `loop` (`generate` or `generate_with_dual_cache`) with
    `steps = gen_length` and the given threshold."""
    code = llada_code(root)
    run = getattr(code, loop)
    rows_at_once = 1 if loop in ONE_PROMPT_LOOPS else None

    def factory(config):
        hf_config = code.LLaDAConfig(**llada_config_json(config))
        hf_config.use_cache = False  # transformers 5 takes use_cache out of a config's keywords; the model reads it
        return lambda: code.LLaDAModelLM(hf_config, init_params=False)

    def decoder(torch_model, config, device: str):
        import torch

        def decode(ids: np.ndarray):
            tokens, forwards = [], 0
            for start in range(0, ids.shape[0], rows_at_once or ids.shape[0]):
                prompt = torch.as_tensor(ids[start:start + (rows_at_once or ids.shape[0])], dtype=torch.long,
                                         device=device)
                x, nfe = run(torch_model, prompt, steps=gen_length, gen_length=gen_length,
                             block_length=block_length, temperature=0.0, remasking="low_confidence",
                             mask_id=config.mask_token_id, threshold=threshold)
                tokens.append(x[:, ids.shape[1]:].cpu().numpy())
                forwards += int(nfe)
            return np.concatenate(tokens), forwards, forwards // (ids.shape[0] if rows_at_once else 1)

        return decode

    return Counterpart(factory, decoder)


def hf_greedy(*, gen_length: int):
    """transformers' greedy `generate` of a Qwen2 / Llama model."""

    def factory(config):
        import transformers

        hf_config = transformers.AutoConfig.for_model(**config_to_hf(config))
        return lambda: transformers.AutoModelForCausalLM.from_config(hf_config)

    def decoder(torch_model, config, device: str):
        import torch

        torch_model.generation_config.eos_token_id = None  # exactly gen_length tokens, as jaxdllm's rows

        def decode(ids: np.ndarray):
            prompt = torch.as_tensor(ids, dtype=torch.long, device=device)
            out = torch_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=gen_length,
                                       min_new_tokens=gen_length, do_sample=False, eos_token_id=None,
                                       pad_token_id=config.pad_token_id)
            return out[:, ids.shape[1]:].cpu().numpy(), gen_length, gen_length

        return decode

    return Counterpart(factory, decoder)


def hf_diffusiongemma(*, gen_length: int, steps: int, key_seed: int):
    """transformers' DiffusionGemma `generate` (canvases of the model's length filling
    `gen_length`, at most `steps` denoising steps each, shared draws of `jax.random.key(key_seed)`)."""
    from sampling.benchmarks import diffusiongemma_speed as dg

    def factory(config):
        import transformers

        hf_config = transformers.DiffusionGemmaConfig.from_dict(dg.hf_config_dict(config))
        return lambda: transformers.DiffusionGemmaForBlockDiffusion(hf_config)

    def decoder(torch_model, c, device: str):
        import jax
        import torch
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

        kwargs = dict(max_new_tokens=gen_length, max_denoising_steps=steps,
                      sampler_config=EntropyBoundSamplerConfig(entropy_bound=dg.SETTINGS["entropy_bound"]),
                      t_min=dg.SETTINGS["t_min"], t_max=dg.SETTINGS["t_max"],
                      stability_threshold=dg.SETTINGS["stability_threshold"],
                      confidence_threshold=dg.SETTINGS["confidence_threshold"], eos_token_id=list(dg.STOP_IDS),
                      pad_token_id=dg.PAD_ID)
        tables = {}

        def decode(ids: np.ndarray):
            batch = ids.shape[0]
            if batch not in tables:  # made once per batch size, before any timed call
                tables[batch] = dg.draw_table(jax.random.key(key_seed), batch, gen_length // c.block_size, steps,
                                              c.block_size, c.vocab_size)
            prompt = torch.as_tensor(ids, dtype=torch.long, device=device)
            with dg.shared_draws(tables[batch], device) as state:
                out = torch_model.generate(prompt, **kwargs)
            tokens = out.sequences[:, ids.shape[1]:].cpu().numpy()
            tokens = np.pad(tokens, ((0, 0), (0, gen_length - tokens.shape[1])), constant_values=dg.PAD_ID)
            return tokens, state["forwards"], state["forwards"]

        return decode

    return Counterpart(factory, decoder, unused=("model.encoder.vision_tower", "model.encoder.embed_vision"))
