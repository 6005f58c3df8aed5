"""DiffusionGemma's training layout against its decoding path: the objective's denoiser logits for
each canvas (one forward over the whole row under `denoise_canvas`, over the encoder's clean K/V)
equal the logits of the decoding path (the prompt and the earlier canvases encoded into a cache,
then the canvas denoised over it; checked against transformers in tests/models), with and without
self-conditioning, in rows with different prompt lengths and sliding windows shorter than the context."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ModelConfig, Transformer
from jaxdllm.attention import MaskSpec
from jaxdllm.train.objectives import Views, make_objective

C = 8  # the tiny preset's canvas; its sliding window is 8 too


def _views(model):
    forward = lambda t, p, m, cache=None, **kw: model(t, positions=p, attention=m, cache=cache, **kw)  # noqa: E731
    return Views(student=lambda t, p, m: forward(t, p, m).logits, config=model.config, forward=forward,
                 init_cache=model.init_cache)


@jax.jit
def _training_path(graphdef, state, clean, noisy, positions, seg, prompts, use_sc):
    """The objective's encoder logits and denoiser logits (self-conditioned rows: `use_sc`), and the
    first, unconditioned pass that conditions them."""
    views = _views(nnx.merge(graphdef, state))
    objective = make_objective("uniform_block_diffusion", {}, views.config)
    encoded, logits = objective.forward(views, clean, noisy, positions, seg, prompts, use_sc)
    first = dataclasses.replace(objective, self_conditioning=0.0).forward(views, clean, noisy, positions, seg,
                                                                          prompts, use_sc)[1]
    return encoded.logits, logits, first


@jax.jit
def _decoding_path(graphdef, state, clean, noisy, start, sc, sc_mask):
    """One row's canvas at `start` as the sampler denoises it: what comes before it (the prompt, the
    earlier canvases, clean) in the encoder's cache, then the noisy canvas over that cache."""
    model = nnx.merge(graphdef, state)
    cache = model(clean, attention=MaskSpec(kind="causal"), cache=model.init_cache(1, clean.shape[1]),
                  encode=True).cache.truncate(start)  # causal: the slots before `start` saw only the context
    canvas = jax.lax.dynamic_slice_in_dim(noisy, start, C, axis=1)
    return model(canvas, (start + jnp.arange(C))[None], MaskSpec(q_offset=start), cache,
                 self_conditioning=sc, self_conditioning_mask=sc_mask).logits[0]


def test_training_logits_equal_the_decoding_path():
    model = Transformer(ModelConfig.preset("tiny-diffusiongemma"), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts, length = [5, 3], 5 + 2 * C
    clean = rng.integers(3, 256, (2, length))
    noisy = np.where(rng.random((2, length)) < 0.5, rng.integers(3, 256, (2, length)), clean)
    seg = np.ones((2, length), np.int32)
    seg[1, 3 + 2 * C:] = 0  # the shorter row is right-padded
    positions = np.broadcast_to(np.arange(length), (2, length))
    use_sc = np.array([False, True])
    encoder, logits, first = _training_path(graphdef, state, clean, noisy, positions, seg, np.asarray(prompts), use_sc)
    for row, p in enumerate(prompts):
        for canvas in range(2):
            cols = slice(p + canvas * C, p + (canvas + 1) * C)
            want = _decoding_path(graphdef, state, clean[row:row + 1], noisy[row:row + 1], p + canvas * C,
                                  first[row:row + 1, cols], use_sc[row:row + 1])
            np.testing.assert_allclose(np.asarray(logits[row, cols]), np.asarray(want), atol=2e-5, rtol=1e-5,
                                       err_msg=f"row {row} canvas {canvas} self-conditioning {use_sc[row]}")
    # the encoder's logits are the causal model's over the clean row
    enc = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x, attention=MaskSpec(kind="causal"), encode=True).logits)
    np.testing.assert_allclose(np.asarray(encoder[:1]), np.asarray(enc(state, clean[:1])), atol=2e-5, rtol=1e-5)


@pytest.mark.slow  # the default run trains one step of every objective (tests/test_contracts.py)
def test_the_loss_trains_encoder_and_denoiser():
    """One gradient step of the objective moves both the encoder's and the decoder's layer scalars."""
    model = Transformer(ModelConfig.preset("tiny-diffusiongemma"), rngs=nnx.Rngs(1))
    objective = make_objective("uniform_block_diffusion", {}, model.config)
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 256, (4, 21))
    batch = {"tokens": tokens, "segment_ids": np.ones((4, 21), np.int32),
             "positions": np.broadcast_to(np.arange(21), (4, 21)),
             "prompt_mask": np.arange(21)[None].repeat(4, 0) < 5, "target_mask": np.arange(21)[None].repeat(4, 0) >= 5}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_of(params):
        return objective(_views(nnx.merge(graphdef, params, rest)), batch, jax.random.key(0))

    (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(params)
    assert np.isfinite(float(loss)) and float(metrics["encoder_loss"]) > 0 and float(metrics["denoise_loss"]) > 0
    layer = grads["layers"][0]
    assert float(jnp.abs(layer["layer_scalar"][...]).sum()) > 0 and float(jnp.abs(layer["encoder_layer_scalar"][...]).sum()) > 0
    assert float(jnp.abs(grads["self_conditioning"]["mlp"]["gate"]["kernel"][...]).sum()) > 0
