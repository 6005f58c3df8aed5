"""Multiverse's fork and merge in the one loop, on a random model with a scripted chooser.

The chooser writes a fixed Multiverse text (three outlines, paths of different lengths, a conclusion)
by path and position, so the test knows every token, position and forward the published rules give:
the merged answer in text order, the sequential forward count, and the merged sequence's next logits,
which must equal transformers' plain forward over the merged text with the Multiverse mask (paths
mutually invisible) and positions (every path from goal_end + 1, the conclusion after the longest),
both written here from the published description.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm.attention.shared_view import SharedView
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.decoding.policies.multiverse import TAGS, Multiverse
from support.hf_models import make_hf_model
from support.optional import torch

EOS = 2
TAG = {name: 101 + i for i, name in enumerate(TAGS)}
DIGITS = tuple(range(22, 32))
COLON = 32
PROMPT = [1, 40, 41, 42, 43]          # positions 0..4
# the request's own row: position -> token (the prefill samples position 5)
ROOT = {5: TAG["<Parallel>"], 6: TAG["<Goal>"], 7: TAG["<Outline>"], 8: 60, 9: TAG["</Outline>"],
        10: TAG["<Outline>"], 11: 61, 12: TAG["</Outline>"], 13: TAG["<Outline>"], 14: 62,
        15: TAG["</Outline>"], 16: TAG["</Goal>"],
        # the conclusion: "<Conclusion>" is fed at 25 (after path 3's </Path> at 24); the model goes on at 26
        26: 70, 27: TAG["</Conclusion>"], 28: TAG["</Parallel>"], 29: EOS}
# path k is fed "<Path>k:" at 17..19 and goes on from 20
PATHS = {1: [80, 81, TAG["</Path>"]], 2: [82, TAG["</Path>"]], 3: [83, 84, 85, 86, TAG["</Path>"]]}


@dataclasses.dataclass(frozen=True)
class Scripted(Multiverse):
    """Chooses the scripted token for (path, position); anything else is a test failure (token 0)."""

    def choose(self, logits, key, temperature, *, path, position):
        table = np.zeros((4, 64), np.int32)
        for p, t in ROOT.items():
            table[0, p] = t
        for k, tokens in PATHS.items():
            table[k, 20:20 + len(tokens)] = tokens
        return jnp.asarray(table)[jnp.clip(path, 0, 3), jnp.clip(position, 0, 63)]


def _policy(**settings):
    return Scripted(tag_base=101, path_prefix=(TAG["<Path>"],), digit_ids=DIGITS, path_suffix=(COLON,),
                    conclusion_prefix=(TAG["<Conclusion>"],), **settings)


def _merged_text():
    """The merged answer in text order and each token's position, as training lays it out."""
    tokens = [ROOT[p] for p in range(5, 17)]
    positions = list(range(5, 17))
    for k, path in PATHS.items():
        body = [TAG["<Path>"], DIGITS[k], COLON] + path
        tokens += body
        positions += list(range(17, 17 + len(body)))
    tokens += [TAG["<Conclusion>"], 70, TAG["</Conclusion>"], TAG["</Parallel>"]]
    positions += [25, 26, 27, 28]
    return tokens, positions


def _published_mask(tokens: list[int]) -> np.ndarray:
    """Causal, then every pair of different <Path> spans of one <Parallel> masked both ways (a stack walk)."""
    n = len(tokens)
    allowed = np.tril(np.ones((n, n), bool))
    stack = []  # per open <Parallel>: its path spans
    start = None
    for i, t in enumerate(tokens):
        if t == TAG["<Parallel>"]:
            stack.append([])
        elif t == TAG["<Path>"]:
            start = i
        elif t == TAG["</Path>"]:
            stack[-1].append((start, i))
        elif t == TAG["</Parallel>"]:
            spans = stack.pop()
            for a, (s1, e1) in enumerate(spans):
                for s2, e2 in spans[a + 1:]:
                    allowed[s1:e1 + 1, s2:e2 + 1] = False
                    allowed[s2:e2 + 1, s1:e1 + 1] = False
    return allowed


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa", seed=5, eos_token_id=EOS, pad_token_id=0, bos_token_id=1)
    path = tmp_path_factory.mktemp("multiverse")
    hf.save_pretrained(path)
    return jaxdllm.from_pretrained(path), hf


def _run(model, prompts, **settings):
    config = SamplerConfig(gen_length=48, policy=_policy(**settings))
    return jaxdllm.decoding.sampler.Sampler(model), config, jaxdllm.generate(model, np.asarray(prompts), config)


def test_fork_and_merge_write_the_merged_text_in_the_published_layout(checkpoint):
    model, _ = checkpoint
    _, _, result = _run(model, [PROMPT, PROMPT])
    tokens, _ = _merged_text()
    for row in result.generated:
        assert list(row[:len(tokens) + 1]) == tokens + [EOS]
        assert (row[len(tokens):] == EOS).all()
    # sequential forwards: 11 feeding the goal (the prefill gave its first token), 1 feeding </Goal> with the
    # three path prefixes, 4 more along path 3 (the longest), 1 feeding its </Path> with the conclusion's
    # prefix, 3 to EOS
    assert list(result.nfe) == [20, 20]


def test_a_request_without_rows_for_its_paths_goes_on_sequentially(checkpoint):
    model, _ = checkpoint
    # two paths at most: the three-outline fork is refused, the row writes on in its own block
    _, _, result = _run(model, [PROMPT], max_paths=2)
    assert result.generated[0][11] == TAG["</Goal>"]  # then the scripted root has nothing for position 17: 0
    assert result.generated[0][12] == 0


def test_the_merged_sequence_s_next_logits_equal_a_plain_forward_with_the_multiverse_mask(checkpoint):
    model, hf = checkpoint
    policy = _policy()
    config = SamplerConfig(gen_length=48, policy=policy)
    sampler = jaxdllm.decoding.sampler.Sampler(model)
    from jaxdllm.decoding import loop
    from jaxdllm.decoding.canvases import canvas_of
    from jaxdllm.decoding.layout import CanvasView, Layout

    prompt = jnp.asarray([PROMPT], jnp.int32)
    seg = jnp.ones_like(prompt)
    lay = Layout(prompt_len=5, total=5 + 48, mask_id=None, shift=0, eos_eot=(EOS,), eos_id=EOS, attention="causal")
    view = CanvasView.of(seg, 48)
    canvas = canvas_of(config)
    state = canvas.init(model, prompt, view, jax.random.key(0), lay, config, jnp.ones((1,), bool))
    step = jax.jit(lambda s: canvas.step(model, s, view, lay, config).replace(step=s.step + 1))
    while not bool(state.done[0]):
        state = step(state)
    f = state.cache
    extra = 90  # one more token after the merged text, at the root's next position
    shared = SharedView(view_blocks=jnp.where(jnp.arange(f.view_blocks.shape[1])[None] < f.n_view[:1, None],
                                              f.view_blocks[:1], -1),
                        view_offsets=f.view_offsets[:1],
                        write_block=f.view_blocks[0, f.n_view[0] - 1][None], write_slot=f.fill[:1],
                        q_valid=jnp.ones((1, 1), bool))
    ours = model(jnp.asarray([[extra]]), f.pos[:1, None], shared, f.kv).logits[0, 0]
    tokens, positions = _merged_text()
    text = PROMPT + tokens + [extra]
    pos = list(range(5)) + positions + [positions[-1] + 1]
    assert int(f.pos[0]) == pos[-1]
    allowed = _published_mask(text)
    bias = torch.zeros(allowed.shape).masked_fill(torch.as_tensor(~allowed), float("-inf"))[None, None]
    with torch.no_grad():
        plain = hf(torch.tensor([text]), attention_mask=bias, position_ids=torch.tensor([pos])).logits[0, -1].numpy()
    np.testing.assert_allclose(np.asarray(ours), plain, atol=2e-4, rtol=1e-4)
    # and the masking matters: path 3 seeing paths 1 and 2 gives other logits
    with torch.no_grad():
        causal = hf(torch.tensor([text]), position_ids=torch.tensor([pos])).logits[0, -1].numpy()
    assert np.abs(causal - plain).max() > 1e-3
