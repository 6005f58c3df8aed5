"""SDAR's decoding in jaxdllm's compiled loop (presets `sdar`, `sdar-static`, `sdar-eb`: blocks of 4 in
the absolute block layout over the block cache) against the published procedure, a PyTorch loop
over transformers' Qwen3 written from JetAstra/SDAR's `generate.py` and JetEngine's
entropy-bounded rule (`sampling/torch_reference/sdar.py`), on a tiny random SDAR checkpoint
(`tests/support/sdar_checkpoint.py`).

Prompts of 5, 8, 11, 14 and 16 tokens (8 and 16: whole blocks, so decoding starts with a block of
MASK; the others start in the block that holds the prompt's tail), 22 generated tokens (not whole
blocks: each row decodes to the end of the block holding its last answer position), in one ragged
batch and each alone. The tokens must equal the reference's, EOS filler after a stop (the published
loop leaves MASK there), and `nfe` its denoising forwards. The reference also counts its store
forwards, one per finished block (the block's K/V written after its last step): the published
forwards per row are `nfe` + one per finished block; jaxdllm's block cache runs that rewrite too and,
as every cache fill that decides nothing, does not count it (nor the last block's, which nothing
reads).

The checkpoint's LM head is scaled so that confidences pass 0.9 and entropies fall under 0.35 nats
in some steps and not in others, and EOS is predicted in some rows: the checks below assert that
the comparison covers steps that commit several tokens and steps that commit one, rows that stop
at EOS and rows that do not. jaxdllm's threshold is `p >= 0.9`, the published `p > 0.9`: the same
except at exactly 0.9.
"""

import numpy as np
import pytest

import jaxdllm
from support.optional import lazy
from support.sdar_checkpoint import BLOCK, EOS, MASK, PROMPT_VOCAB, make_sdar_checkpoint
from support.sampler_fixtures import prompts

sdar_reference = lazy("sampling.torch_reference.sdar")

LENGTHS = [5, 8, 11, 14, 16]
GEN = 22
# (seed, weight std, head scale, EOS scale) of the checkpoint; prompt seed
CHECKPOINT = dict(seed=7, weight_std=0.8, head_scale=7.0, eos_scale=2.0)
PROMPT_SEED = 3
# preset -> the published generate's settings
PUBLISHED = {"sdar": dict(remasking="low_confidence_dynamic", threshold=0.9),
             "sdar-static": dict(remasking="low_confidence_static"),
             "sdar-eb": dict(remasking="entropy_bounded", eb_threshold=0.35)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(jaxdllm model, transformers model, checkpoint folder): one checkpoint for the module."""
    path = tmp_path_factory.mktemp("sdar")
    hf = make_sdar_checkpoint(path, **CHECKPOINT)
    return jaxdllm.from_pretrained(path), hf, path


def published(hf, rows, preset, gen_length=GEN):
    return sdar_reference.generate(hf, [list(map(int, r)) for r in rows], mask_id=MASK, eos_id=EOS,
                                   gen_length=gen_length, block_length=BLOCK, steps=BLOCK, **PUBLISHED[preset])


def with_eos_filler(tokens):
    """The published answer with the MASK it leaves after a stop as EOS (jaxdllm's filler)."""
    return [EOS if t == MASK else t for t in tokens]


def per_step_commits(result, row: int) -> np.ndarray:
    """Tokens each of the row's forwards committed among its `gen_length` answer positions (the
    forwards that committed only past them left out)."""
    steps = np.asarray(result.commit_step)[row, result.prompt_len:]
    counts = np.bincount(steps[steps > 0], minlength=int(result.nfe[row]) + 1)[1:]
    return counts[counts > 0]


# the default run: the threshold and entropy-bound rules (parallel steps); one token per step in the slow run
@pytest.mark.parametrize("preset", [pytest.param(p, marks=pytest.mark.slow) if p == "sdar-static" else p
                                    for p in PUBLISHED])
def test_presets_decode_as_the_published_generate(checkpoint, preset):
    model, hf, path = checkpoint
    config = jaxdllm.sampler_defaults(path, preset, gen_length=GEN)
    assert (config.block_length, config.cache.name, config.stop_at_eos, config.temperature) == (BLOCK, "block",
                                                                                                "block", 0.0)
    ids, mask, rows = prompts(LENGTHS, seed=PROMPT_SEED, vocab=PROMPT_VOCAB)
    want = published(hf, rows, preset)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    assert batch.generated.shape == (len(rows), GEN)
    for i, row in enumerate(rows):
        assert batch.generated[i].tolist() == with_eos_filler(want.tokens[i]), f"row of {len(row)} tokens"
        assert int(batch.nfe[i]) == want.denoising_forwards[i], f"row of {len(row)} tokens"
        if EOS not in want.tokens[i]:  # one store forward per decoded block
            assert want.store_forwards[i] == -(-(len(row) + GEN) // BLOCK) - len(row) // BLOCK
    # what the comparison covers: rows that stop at EOS and rows that do not; for the dynamic and
    # entropy-bounded rules, steps that commit several tokens and steps that commit one
    stops = [EOS in t for t in want.tokens]
    assert any(stops) and not all(stops), stops
    # (rows that run to the end: a stopped row's EOS filler counts as decided at its last forward)
    commits = np.concatenate([per_step_commits(batch, i) for i, stop in enumerate(stops) if not stop])
    assert commits.min() == 1
    if preset == "sdar-static":
        assert (commits == 1).all()
    else:
        assert commits.max() > 1, commits


@pytest.mark.parametrize("preset", ["sdar", pytest.param("sdar-static", marks=pytest.mark.slow),
                                    pytest.param("sdar-eb", marks=pytest.mark.slow)])
def test_each_row_alone_decodes_as_in_the_batch(checkpoint, preset):
    model, _, path = checkpoint
    config = jaxdllm.sampler_defaults(path, preset, gen_length=GEN)
    ids, mask, rows = prompts(LENGTHS, seed=PROMPT_SEED, vocab=PROMPT_VOCAB)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    for i, row in enumerate(rows):
        solo = jaxdllm.generate(model, np.asarray(row, np.int32)[None], config)
        np.testing.assert_array_equal(solo.generated[0], batch.generated[i])
        assert int(solo.nfe[0]) == int(batch.nfe[i])


@pytest.mark.slow
@pytest.mark.parametrize("gen_length", [16, 5])
def test_whole_blocks_and_short_answers_decode_as_the_published_generate(checkpoint, gen_length):
    model, hf, path = checkpoint
    config = jaxdllm.sampler_defaults(path, "sdar", gen_length=gen_length)
    ids, mask, rows = prompts(LENGTHS, seed=PROMPT_SEED, vocab=PROMPT_VOCAB)
    want = published(hf, rows, "sdar", gen_length)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    for i, row in enumerate(rows):
        assert batch.generated[i].tolist() == with_eos_filler(want.tokens[i]), f"row of {len(row)} tokens"
        assert int(batch.nfe[i]) == want.denoising_forwards[i], f"row of {len(row)} tokens"


def test_the_cumsum_rule_is_jetengines_and_is_checked():
    """`entropy_bound_rule="cumsum"` against JetEngine's statement written as a loop: the masked
    slots sorted by entropy, `k = searchsorted(cumsum, bound, right=False)` (the number of prefix
    sums below the bound), at least 1; an unknown rule is a `ConfigError` naming both."""
    import jax.numpy as jnp

    from jaxdllm import ConfigError, SamplerConfig
    from jaxdllm.decoding.policies.entropy_bound import entropy_cumsum_accept

    rng = np.random.default_rng(0)
    candidates = rng.random((6, 8)) < 0.7
    candidates[0], candidates[1] = False, True
    entropy = rng.exponential(0.2, (6, 8)).astype(np.float32)
    for bound in (1e-6, 0.1, 0.35, 1.0, 1e6):
        got = np.asarray(entropy_cumsum_accept(jnp.asarray(entropy), jnp.asarray(candidates), bound))
        want = np.zeros_like(candidates)
        for row in range(len(entropy)):
            where = np.flatnonzero(candidates[row])
            if not len(where):
                continue
            ranked = where[np.argsort(entropy[row, where], kind="stable")]
            k = int(np.searchsorted(np.cumsum(entropy[row, ranked]), np.float32(bound), side="left"))
            want[row, ranked[:max(k, 1)]] = True
        np.testing.assert_array_equal(got, want, err_msg=f"bound {bound}")
    with pytest.raises(ConfigError, match=r"entropy_bound_rule must be one of \('eb', 'cumsum'\)"):
        SamplerConfig.preset("sdar-eb", entropy_bound_rule="jetengine")
