"""DiffusionGemma's generation (the uniform-noise canvas, policy `diffusiongemma`) against transformers'
`DiffusionGemmaForBlockDiffusion.generate` on a tiny random checkpoint, in the deterministic setting:
argmax in place of sampling on both sides, and transformers fed the uniform draws jaxdllm used
(`canvas_draws`: each canvas's start and every renoise). Whole generations must agree in tokens and
in forwards (NFE), alone and in a ragged batch, over several canvases with rows that stop early,
rows that stop at EOS and rows that run to the step limit."""

import contextlib

import jax
import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.decoding.uniform_canvas import canvas_draws
from support.diffusion_gemma_reference import make_diffusion_gemma
from support.optional import lazy, require, torch

hf_generation = lazy("transformers.models.diffusion_gemma.generation_diffusion_gemma")

CANVAS, STEPS, CANVASES = 8, 12, 3
# A bound that accepts part of each canvas (the rest is renoised), and a confidence this random model
# reaches in some canvases and not others: with these weights two rows end at EOS (in their first and
# second canvases), one runs all three canvases, some canvases stop early and some at the step limit.
SETTINGS = dict(entropy_bound=3.0, t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.3)
PROMPTS = [[5, 9, 33, 12, 7, 81, 20, 14, 60], [40, 3, 17], [99, 100, 101, 102, 7, 8]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("dg")
    # one sliding layer (window 8, shorter than prompt + canvases) and one full layer
    torch_model = make_diffusion_gemma(path, seed=3, canvas=CANVAS, head_scale=20.0, eos_scale=1.5, branch_scale=0.3,
                                       num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    return torch_model, jaxdllm.from_pretrained(path)


@contextlib.contextmanager
def _same_draws(key, row):
    """transformers' canvas draws replaced by ours for batch row `row`, and its multinomial by argmax."""
    counter = {"canvas": -1, "step": 0}
    prepare = hf_generation.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs

    def prepare_next_canvas(self, *args, **kwargs):
        counter["canvas"] += 1
        counter["step"] = 0
        return prepare(self, *args, **kwargs)

    def draws(self, batch_size, device):
        out = canvas_draws(key, jax.numpy.asarray([row]), counter["canvas"], counter["step"], self.canvas_length,
                           self.vocab_size)
        counter["step"] += 1
        return torch.tensor(np.asarray(out), dtype=torch.long)

    def argmax(probs, num_samples):
        return probs.argmax(-1, keepdim=True)

    patches = [(hf_generation.DiffusionGemmaGenerationMixin, "_prepare_denoiser_inputs", prepare_next_canvas),
               (hf_generation.EntropyBoundSampler, "initialize_canvas", draws),
               (require("torch"), "multinomial", argmax)]  # the module itself, not the stand-in
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _transformers(torch_model, prompt, key, row):
    """transformers' tokens `[G]` and NFE for one prompt, with our draws for batch row `row`."""
    with _same_draws(key, row):
        out = torch_model.generate(
            torch.as_tensor([prompt]), max_new_tokens=CANVAS * CANVASES, max_denoising_steps=STEPS,
            sampler_config=hf_generation.EntropyBoundSamplerConfig(entropy_bound=SETTINGS["entropy_bound"]),
            t_min=SETTINGS["t_min"], t_max=SETTINGS["t_max"], stability_threshold=SETTINGS["stability_threshold"],
            confidence_threshold=SETTINGS["confidence_threshold"], eos_token_id=1, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].numpy()
    valid = int((tokens != 0).sum())
    # transformers stops once every row ended (a shorter output); jaxdllm fills the rest with pad
    tokens = np.pad(tokens, (0, CANVAS * CANVASES - len(tokens)))
    return tokens, round(valid / float(out.tokens_per_forward[0]))


def _config():
    return SamplerConfig.preset("diffusiongemma", gen_length=CANVAS * CANVASES, block_length=CANVAS,
                                max_denoising_steps=STEPS, sample=False, stop_ids=(1,), **SETTINGS)


def test_generate_equals_transformers_alone_and_in_a_ragged_batch(pair):
    torch_model, model = pair
    key = jax.random.key(7)
    want = [_transformers(torch_model, p, key, row) for row, p in enumerate(PROMPTS)]
    width = max(map(len, PROMPTS))
    ids = np.array([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    batch = jaxdllm.generate(model, ids, _config(), mask, key=key)
    alone = jaxdllm.generate(model, np.array([PROMPTS[0]]), _config(), key=key)
    for row, (tokens, nfe) in enumerate(want):
        np.testing.assert_array_equal(batch.generated[row], tokens, err_msg=f"row {row}")
        assert batch.nfe[row] == nfe, (row, batch.nfe[row], nfe)
    np.testing.assert_array_equal(alone.generated[0], want[0][0])
    assert alone.nfe[0] == want[0][1]
    # the cases the test is meant to cover happened
    nfes = [n for _, n in want]
    stopped_at_eos = [(t == 0).any() for t, _ in want]
    assert any(stopped_at_eos) and not all(stopped_at_eos), want
    assert any(n % STEPS for n in nfes), nfes  # some canvas stopped before the step limit
