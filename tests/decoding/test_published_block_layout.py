"""Block-causal models decode in the published layout: the `llada2` and `llada2.1` presets in the
compiled loop against the published LLaDA2.0 / LLaDA2.1 loops (a torch model and a torch loop
written from the published description, `tests/support/llada2_reference.py`).

Prompt lengths 5 and 13 end inside a block of 8 (decoding starts in the block that holds the prompt
tail), 8 and 16 fill whole blocks. Each row is decoded alone and in one ragged batch; the
tokens up to the first EOS and the forwards must equal the published loop's, and each batch row
must equal its run alone. The checkpoints' LM heads are scaled so that thresholds commit several
tokens per step and EOS is predicted now and then: the comparison covers parallel commits, the
finish of the EOS's block, token edits and rows that fill their last block past `gen_length`.
"""

import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from support.llada2_reference import TINY, make_llada2_checkpoint, published_generate
from support.optional import lazy
from support.sampler_fixtures import prompts

safetensors_torch = lazy("safetensors.torch")

EOS = TINY["eos_token_id"]
LENGTHS = [5, 8, 13, 16]
GEN, BLOCK = 24, 8
# (seed, head scale, EOS scale): the default run checks the first, the slow run both.
CHECKPOINTS = [(1, 6.0, 2.0), pytest.param((2, 8.0, 2.0), marks=pytest.mark.slow)]
# The presets at this size; llada2.1 also with lower thresholds, which make it edit.
PRESETS = {"llada2": {}, "llada2.1": {}, "llada2.1-edits": dict(threshold=0.5, editing_threshold=0.6)}


def load(tmp_path_factory, seed, head_scale, eos_scale):
    path = tmp_path_factory.mktemp(f"llada2_seed{seed}")
    weights = make_llada2_checkpoint(path, seed=seed, head_scale=head_scale, eos_scale=eos_scale, block_size=BLOCK)
    return jaxdllm.from_pretrained(path), weights


@pytest.fixture(scope="module", params=CHECKPOINTS, ids=lambda c: f"seed{c[0]}")
def checkpoint(request, tmp_path_factory):
    return load(tmp_path_factory, *request.param)


def sampler_config(name: str, **changes) -> SamplerConfig:
    settings = dict(PRESETS[name])
    return SamplerConfig.preset(name.removesuffix("-edits"), gen_length=GEN, block_length=BLOCK, **settings, **changes)


def published(weights, prompt, config: SamplerConfig):
    editing = config.editing_threshold if config.policy.name == "token_editing" else None
    return published_generate(weights, dict(TINY), prompt, GEN, BLOCK, config.threshold, editing,
                              getattr(config.policy, "max_post_steps", 16))


def up_to_eos(tokens) -> list[int]:
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(EOS) + 1] if EOS in tokens else tokens


# The default run: LLaDA2.0 alone, in a batch and with the block cache, and LLaDA2.1 where it edits
# in a batch; the slow run every preset every way.
@pytest.mark.parametrize("preset,alone", [
    ("llada2", True), ("llada2.1-edits", False),
    pytest.param("llada2.1", True, marks=pytest.mark.slow), pytest.param("llada2.1-edits", True, marks=pytest.mark.slow)])
def test_presets_decode_as_the_published_loops(checkpoint, preset, alone):
    model, weights = checkpoint
    config = sampler_config(preset)
    ids, mask, rows = prompts(LENGTHS, seed=3, vocab=150)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    decoded, reached_eos = [], []
    for i, row in enumerate(rows):
        want, forwards = published(weights, row, config)
        assert up_to_eos(batch.generated[i]) == want, f"row of {len(row)} tokens, in a batch"
        assert int(batch.nfe[i]) == forwards, f"row of {len(row)} tokens, in a batch"
        decoded.append(-(-(len(row) + GEN) // BLOCK) * BLOCK - len(row))  # to the end of the last block
        reached_eos.append(want[-1] == EOS)
    if alone:  # batch 1, and each batch row as alone with and without the block cache
        block_cached = jaxdllm.generate(model, ids, config.replace(cache="block"), attention_mask=mask)
        for i, row in enumerate(rows):
            solo = jaxdllm.generate(model, row[None], config)
            for out in (batch, block_cached):
                np.testing.assert_array_equal(out.generated[i], solo.generated[0])
                assert int(out.nfe[i]) == int(solo.nfe[0])
    # What the comparison covers: EOS in some rows and not in others, parallel commits.
    assert any(reached_eos) and not all(reached_eos), reached_eos
    assert (batch.nfe < np.array(decoded)).any(), (batch.nfe, decoded)


# Lengths that are not whole blocks: the published loops decode any gen_length (to the end of the
# block that holds the last answer position, the rest dropped). 44 = 5 blocks of 8 and a half.
@pytest.mark.parametrize("preset,gen_length", [
    ("llada2", 44), pytest.param("llada2", 5, marks=pytest.mark.slow),
    pytest.param("llada2.1-edits", 21, marks=pytest.mark.slow)])
def test_any_gen_length_decodes_as_the_published_loops(checkpoint, preset, gen_length):
    model, weights = checkpoint
    config = sampler_config(preset).replace(gen_length=gen_length)
    assert config.block_length == BLOCK and gen_length % BLOCK
    ids, mask, rows = prompts(LENGTHS, seed=3, vocab=150)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    assert batch.generated.shape == (len(rows), gen_length)
    editing = config.editing_threshold if config.policy.name == "token_editing" else None
    for i, row in enumerate(rows):
        want, forwards = published_generate(weights, dict(TINY), row, gen_length, BLOCK, config.threshold, editing)
        assert up_to_eos(batch.generated[i]) == want, f"row of {len(row)} tokens"
        assert int(batch.nfe[i]) == forwards, f"row of {len(row)} tokens"
    block_cached = jaxdllm.generate(model, ids, config.replace(cache="block"), attention_mask=mask)
    np.testing.assert_array_equal(block_cached.generated, batch.generated)
    np.testing.assert_array_equal(block_cached.nfe, batch.nfe)


@pytest.mark.slow  # the default run's 6-minute budget
def test_token_stop_keeps_the_tokens_and_saves_forwards(tmp_path_factory):
    """`stop_at_eos=True` (a row stops as soon as its EOS and everything before it are decided)
    keeps LLaDA2.0's tokens up to EOS and never takes more forwards than the published block finish
    (on this checkpoint, a row's EOS comes before the end of its block: fewer forwards)."""
    model, _ = load(tmp_path_factory, *CHECKPOINTS[0])
    ids, mask, _ = prompts(LENGTHS, seed=3, vocab=150)
    block = jaxdllm.generate(model, ids, sampler_config("llada2"), attention_mask=mask)
    token = jaxdllm.generate(model, ids, sampler_config("llada2", stop_at_eos=True), attention_mask=mask)
    for i in range(len(LENGTHS)):
        assert up_to_eos(token.generated[i]) == up_to_eos(block.generated[i])
    assert (token.nfe <= block.nfe).all() and (token.nfe < block.nfe).any()


# LLaDA2.0 on the shipped model in the slow run (the default run's 6-minute budget; its accuracy with
# `llada2` is checked by tests/test_shipped_model.py).
@pytest.mark.parametrize("preset", [pytest.param("llada2", marks=pytest.mark.slow), "llada2.1"])
def test_the_shipped_moe_decodes_as_the_published_loops(preset):
    """A trained model: `tasks-llada2-tiny` (blocks of 8) on task prompts of 11 to 18 tokens, decoded
    with its own block by the preset and by the published loop on the torch forward. With token
    editing, the model re-decides committed tokens it was never trained to keep (its objective
    scores masked positions only): "copy 2718=" oscillates until the post-mask step limit."""
    import json

    from jaxdllm.shipped import shipped_checkpoint

    path = shipped_checkpoint("tasks-llada2-tiny")
    cfg = json.loads((path / "config.json").read_text())
    weights = {k: v.float() for k, v in safetensors_torch.load_file(str(path / "model.safetensors")).items()}
    model, tok, _ = jaxdllm.load(path)
    config = SamplerConfig.preset(preset, gen_length=16, block_length=8)
    texts = ["copy 2718=", "copy 02206445=", "reverse 1234567=", "reverse 98765432="]
    batch = jaxdllm.generate(model, tok(texts), config)
    eos = cfg["eos_token_id"]
    for i, text in enumerate(texts):
        editing = config.editing_threshold if preset == "llada2.1" else None
        want, forwards = published_generate(weights, cfg, tok([text]).ids[0], 16, 8, config.threshold, editing)
        got = [int(t) for t in batch.generated[i]]
        assert got[:got.index(eos) + 1] == want and int(batch.nfe[i]) == forwards, (text, tok.decode(want))
    if preset == "llada2.1":
        assert int(batch.nfe[0]) == 17  # one forward decides "2718<eos>", then 16 mask-free edit steps
