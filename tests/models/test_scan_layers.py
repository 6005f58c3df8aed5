"""`scan_layers` (parameters stacked on a `layers` axis, one `lax.scan`) and `remat` change how the
model runs, not what it computes: against the unrolled model loaded from the same transformers
checkpoint, logits, cached K/V, gradients and decoded tokens are equal, sharded or not, and the
scanned model saves back the same checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import MaskSpec, SamplerConfig
from jaxdllm.sharding import make_mesh
from support.forward import forward
from support.hf_models import hf_logits, make_hf_model
from support.sampler_fixtures import prompts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa")  # 3 layers, GQA, biases
    path = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(path)
    return hf, path


@pytest.mark.parametrize("remat", [pytest.param("none", marks=pytest.mark.slow), "full"])  # "dots": tests/train/test_train.py
def test_scanned_logits_cache_and_gradients_equal_the_unrolled_model(checkpoint, remat):
    hf, path = checkpoint
    unrolled = jaxdllm.from_pretrained(path)
    scanned = jaxdllm.from_pretrained(path, scan_layers=True, remat=remat)
    assert scanned.layers.attn.q.kernel[...].shape[0] == 3  # one stacked parameter per kernel
    ids = np.random.RandomState(1).randint(0, 128, (2, 11))
    np.testing.assert_allclose(np.asarray(forward(scanned, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=1e-4)

    # exact KV cache: prefill 7 tokens, then feed 4 at offset 7
    outs = {}
    for name, m in (("unrolled", unrolled), ("scanned", scanned)):
        cache = m.init_cache(2, 16)
        cache = forward(m, jnp.asarray(ids[:, :7]), None, MaskSpec(kind="causal"), cache).cache
        outs[name] = forward(m, jnp.asarray(ids[:, 7:]), None, MaskSpec(kind="causal", q_offset=7), cache)
    np.testing.assert_allclose(np.asarray(outs["scanned"].logits), np.asarray(outs["unrolled"].logits), atol=1e-5)
    for layer in range(3):
        np.testing.assert_allclose(np.asarray(outs["scanned"].cache.k[layer]),
                                   np.asarray(outs["unrolled"].cache.k[layer]), atol=1e-5)

    def grads(m):
        return nnx.grad(lambda m: jnp.mean(jax.nn.log_softmax(m(jnp.asarray(ids)).logits)[..., 3]))(m)

    g_unrolled, g_scanned = nnx.jit(grads)(unrolled), nnx.jit(grads)(scanned)
    for layer in range(3):
        for name in ("q", "v"):
            np.testing.assert_allclose(np.asarray(g_scanned["layers"]["attn"][name]["kernel"][...][layer]),
                                       np.asarray(g_unrolled["layers"][layer]["attn"][name]["kernel"][...]),
                                       atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_scanned["embed"][...]), np.asarray(g_unrolled["embed"][...]), atol=1e-6)


def test_scanned_model_loads_sharded_and_saves_the_same_checkpoint(checkpoint, tmp_path):
    hf, path = checkpoint
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    scanned = jaxdllm.from_pretrained(path, scan_layers=True, mesh=mesh)
    kernel = scanned.layers.mlp.up.kernel[...]
    assert kernel.sharding.spec[0] is None and len(kernel.sharding.device_set) == 8  # layers replicated
    ids = np.random.RandomState(2).randint(0, 128, (2, 9))
    np.testing.assert_allclose(np.asarray(forward(scanned, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=1e-4)
    out = jaxdllm.save_pretrained(scanned, tmp_path / "again")
    np.testing.assert_allclose(np.asarray(forward(jaxdllm.from_pretrained(out), jnp.asarray(ids)).logits),
                               hf_logits(hf, ids), atol=1e-4)


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_scanned_models_decode_the_same_tokens(checkpoint, tmp_path):
    _, path = checkpoint
    ids, mask, _ = prompts([3, 6], seed=5, vocab=128)
    jacobi = SamplerConfig(policy="jacobi", gen_length=10, window=4, prompt_bucket=8)
    a = jaxdllm.generate(jaxdllm.from_pretrained(path, pad_token_id=0), ids, jacobi, attention_mask=mask)
    b = jaxdllm.generate(jaxdllm.from_pretrained(path, pad_token_id=0, scan_layers=True), ids, jacobi,
                         attention_mask=mask)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    # a diffusion model through Fast-dLLM's dual cache (stacked K/V in the loop carry)
    diffusion = dict(attention="bidirectional", mask_token_id=127, pad_token_id=0)
    dual = SamplerConfig(policy="threshold", cache="dual", gen_length=8, block_length=4, prompt_bucket=8)
    a = jaxdllm.generate(jaxdllm.from_pretrained(path, **diffusion), ids, dual, attention_mask=mask)
    b = jaxdllm.generate(jaxdllm.from_pretrained(path, scan_layers=True, **diffusion), ids, dual,
                         attention_mask=mask)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.nfe, b.nfe)
