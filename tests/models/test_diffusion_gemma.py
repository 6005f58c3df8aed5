"""DiffusionGemma against transformers' `DiffusionGemmaForBlockDiffusion` on tiny random checkpoints it
wrote itself: the causal encoder, the denoiser over [cache; canvas] with and without self-conditioning,
a second canvas after the first was encoded, sliding windows shorter than the context; the round trip;
int8."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm.attention import MaskSpec
from jaxdllm.models.config import ModelConfig
from support.diffusion_gemma_reference import denoiser_logits, encoder_logits, make_diffusion_gemma
from support.optional import torch, transformers

# (text-config overrides, prompt length): the window (8) is shorter than the prompt, or longer than
# the whole context; layers alternate, or follow the published pattern (a full layer every 6th and last).
CONFIGS = {
    "window_shorter_than_the_prompt": ({}, 13),
    "published_layer_pattern": (dict(num_hidden_layers=6, layer_types=None, sliding_window=64), 9),
}


@pytest.fixture(scope="module", params=[name if name == "window_shorter_than_the_prompt" else
                                        pytest.param(name, marks=pytest.mark.slow) for name in CONFIGS])
def pair(request, tmp_path_factory):
    """(torch model, jaxdllm model, prompt length, checkpoint folder) for one config."""
    overrides, prompt_len = CONFIGS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    torch_model = make_diffusion_gemma(path, seed=len(request.param), **overrides)
    return torch_model, jaxdllm.from_pretrained(path), prompt_len, path


def _ids(seed, shape, vocab=256):
    return np.random.default_rng(seed).integers(3, vocab, shape)


def _close(ours, theirs, atol=1e-4):
    np.testing.assert_allclose(np.asarray(ours), theirs.float().numpy(), atol=atol, rtol=1e-4)


@functools.partial(jax.jit, static_argnames=("graphdef", "encode"))
def _forward(graphdef, state, ids, cache, start, sc, sc_mask, *, encode):
    """The encoder (causal, writes the cache) or the denoiser (bidirectional over [cache; canvas])."""
    model = nnx.merge(graphdef, state)
    positions = jnp.broadcast_to(start + jnp.arange(ids.shape[1]), ids.shape)
    mask = MaskSpec(kind="causal" if encode else "bidirectional", q_offset=start)
    return model(ids, positions=positions, attention=mask, cache=cache, encode=encode,
                 self_conditioning=None if encode else sc, self_conditioning_mask=sc_mask)


def _run(model, ids, cache, start, sc=None, *, encode):
    graphdef, state = nnx.split(model)
    b, length = ids.shape
    use = sc is not None
    sc = jnp.zeros((b, length, model.config.vocab_size)) if sc is None else jnp.asarray(sc)
    return _forward(graphdef, state, jnp.asarray(ids), cache, jnp.int32(start), sc, jnp.full((b,), use),
                    encode=encode)


def test_encoder_and_denoiser_logits_match_transformers(pair):
    """The causal encoder over a ragged-free batch of prompts; the denoiser over a canvas after it,
    without self-conditioning (its first step) and with; the denoiser over a second canvas after the
    first was encoded into the cache."""
    torch_model, model, p, _ = pair
    c = model.config.block_size
    prompt, first, second = _ids(1, (2, p)), _ids(2, (2, c)), _ids(3, (2, c))
    out = _run(model, prompt, model.init_cache(2, p + 2 * c), 0, encode=True)
    _close(out.logits, encoder_logits(torch_model, torch.as_tensor(prompt)))
    cache = out.cache
    t_prompt, t_first, t_second = map(torch.as_tensor, (prompt, first, second))
    _close(_run(model, first, cache, p, encode=False).logits, denoiser_logits(torch_model, t_prompt, [t_first]))
    sc = np.random.default_rng(4).normal(size=(2, c, 256)).astype(np.float32) * 3
    _close(_run(model, first, cache, p, sc, encode=False).logits,
           denoiser_logits(torch_model, t_prompt, [t_first], torch.as_tensor(sc)))
    cache = _run(model, first, cache, p, encode=True).cache
    _close(_run(model, second, cache, p + c, sc, encode=False).logits,
           denoiser_logits(torch_model, t_prompt, [t_first, t_second], torch.as_tensor(sc)))


def test_config_reads_the_published_shape_and_round_trips(tmp_path, pair):
    torch_model, model, _, _ = pair
    c = model.config
    assert c.gemma4.layer_types == tuple(t.split("_")[0] for t in torch_model.config.text_config.layer_types)
    assert c.kv_shape(c.gemma4.layer_types.index("full")) == (1, 32)
    out = jaxdllm.save_pretrained(model, tmp_path / "out")
    again = jaxdllm.from_pretrained(out)
    assert again.config == c
    ids = _ids(7, (1, 5))
    np.testing.assert_array_equal(np.asarray(_run(again, ids, again.init_cache(1, 5), 0, encode=True).logits),
                                  np.asarray(_run(model, ids, model.init_cache(1, 5), 0, encode=True).logits))
    # transformers reads what we wrote: the same encoder logits
    reread = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(out).eval()
    _close(_run(model, ids, model.init_cache(1, 5), 0, encode=True).logits, encoder_logits(reread, torch.as_tensor(ids)))
    assert json.loads((out / "config.json").read_text())["text_config"]["eos_token_id"] == 1
    # sharded files stream in tensor by tensor (the experts' gate-up tensor stays whole in one file)
    sharded = jaxdllm.save_pretrained(model, tmp_path / "sharded", max_shard_size="40KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    again = jaxdllm.from_pretrained(sharded)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                                 nnx.to_flat_state(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(path))


def test_published_preset_counts_its_parameters():
    c = ModelConfig.preset("google/diffusiongemma-26B-A4B-it")
    assert [i for i, t in enumerate(c.gemma4.layer_types) if t == "full"] == [5, 11, 17, 23, 29]
    assert round(c.num_params / 1e9, 2) == 25.25  # the published text parameter count
    assert round(c.active_params / 1e9, 1) == 3.8


# int8 against float32 on these random tiny checkpoints, whose logits spread only ~0.15 (std) so that
# near-ties are common: measured max 0.11-0.13, mean 0.012-0.017, the same argmax at 85-89 % of positions.
INT8_MAX_ABS, INT8_MEAN_ABS, INT8_ARGMAX = 0.2, 0.03, 0.8


def test_int8_stays_within_the_stated_tolerance(pair):
    """Weight-only int8 (per output channel; every projection and expert kernel) against float32."""
    _, model, p, path = pair
    q8 = jaxdllm.from_pretrained(path, quantization="int8")
    ids = _ids(8, (1, p))
    full = np.asarray(_run(model, ids, model.init_cache(1, p), 0, encode=True).logits)
    low = np.asarray(_run(q8, ids, q8.init_cache(1, p), 0, encode=True).logits)
    diff = np.abs(low - full)
    assert diff.max() <= INT8_MAX_ABS and diff.mean() <= INT8_MEAN_ABS, (diff.max(), diff.mean())
    assert np.mean(low.argmax(-1) == full.argmax(-1)) >= INT8_ARGMAX
    assert q8.layers[0].experts.gate.kernel.get_value().dtype == jnp.int8


def test_the_checkpoint_generation_config_sets_the_sampler(pair, tmp_path):
    """`jaxdllm.load` and the command line decode a DiffusionGemma checkpoint with its published
    generation settings (`generation_config.json`) on canvases of its own length."""
    from jaxdllm.pretrained import sampler_defaults

    *_, path = pair
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text((path / "config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({
        "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1,
        "confidence_threshold": 0.005, "sampler_config": {"entropy_bound": 0.1, "_cls_name": "EntropyBoundSamplerConfig"},
        "eos_token_id": [1, 106, 50], "max_new_tokens": 20}))
    config = sampler_defaults(folder)
    assert config.policy.name == "diffusiongemma" and config.block_length == 8 and config.gen_length == 24
    assert config.policy.stop_ids == (1, 106, 50) and config.policy.max_denoising_steps == 48
    assert sampler_defaults(folder, max_denoising_steps=4).policy.max_denoising_steps == 4
