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
from jaxdllm.decoding.canvases import canvas_of
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.decoding.layout import CanvasView, Layout
from jaxdllm.decoding.policies.multiverse import TAGS, Multiverse
from support.forward import forward
from support.hf_models import make_hf_model
from support.optional import torch

EOS = 2
TAG = {name: 101 + i for i, name in enumerate(TAGS)}
DIGITS = tuple(range(22, 32))
COLON = 32
PROMPT = [1, 40, 41, 42, 43]          # positions 0..4
T = TAG


def _path(k):
    return [T["<Path>"], DIGITS[k], COLON]


# A script: what each row chooses by (path, position) (path 0: the request's own row; the prefill samples
# position 5), the merged text as training lays it out (segments of tokens from a start position, in text
# order), and the sequential forwards the rules give.
FLAT = dict(
    choices={0: {5: T["<Parallel>"], 6: T["<Goal>"], 7: T["<Outline>"], 8: 60, 9: T["</Outline>"],
                 10: T["<Outline>"], 11: 61, 12: T["</Outline>"], 13: T["<Outline>"], 14: 62,
                 15: T["</Outline>"], 16: T["</Goal>"],
                 # "<Conclusion>" is fed at 25, after path 3's </Path> at 24
                 26: 70, 27: T["</Conclusion>"], 28: T["</Parallel>"], 29: EOS},
             # path k is fed "<Path>k:" at 17..19 and goes on from 20
             1: {20: 80, 21: 81, 22: T["</Path>"]}, 2: {20: 82, 21: T["</Path>"]},
             3: {20: 83, 21: 84, 22: 85, 23: 86, 24: T["</Path>"]}},
    merged=[([T["<Parallel>"], T["<Goal>"], T["<Outline>"], 60, T["</Outline>"], T["<Outline>"], 61,
              T["</Outline>"], T["<Outline>"], 62, T["</Outline>"], T["</Goal>"]], 5),
            (_path(1) + [80, 81, T["</Path>"]], 17), (_path(2) + [82, T["</Path>"]], 17),
            (_path(3) + [83, 84, 85, 86, T["</Path>"]], 17),
            ([T["<Conclusion>"], 70, T["</Conclusion>"], T["</Parallel>"]], 25)],
    # the prefill (position 5), 11 feeding the goal, 1 feeding </Goal> with the three path prefixes, 4 more along path 3 (the longest),
    # 1 feeding its </Path> with the conclusion's prefix, 3 to EOS
    nfe=21)
NESTED = dict(
    choices={0: {5: T["<Parallel>"], 6: T["<Goal>"], 7: T["<Outline>"], 8: 60, 9: T["</Outline>"],
                 10: T["<Outline>"], 11: 61, 12: T["</Outline>"], 13: T["</Goal>"],
                 39: 70, 40: T["</Conclusion>"], 41: T["</Parallel>"], 42: EOS},
             # outer path 1 (fed "<Path>1:" at 14..16) forks again at 25; its nested paths start at 26 and
             # its own conclusion at 32; nested path 2 ends last (31); outer path 1 ends at 37
             1: {17: T["<Parallel>"], 18: T["<Goal>"], 19: T["<Outline>"], 20: 63, 21: T["</Outline>"],
                 22: T["<Outline>"], 23: 64, 24: T["</Outline>"], 25: T["</Goal>"],
                 29: 90, 30: T["</Path>"],
                 33: 93, 34: T["</Conclusion>"], 35: T["</Parallel>"], 36: 94, 37: T["</Path>"]},
             2: {17: 82, 18: T["</Path>"], 29: 91, 30: 92, 31: T["</Path>"]}},
    merged=[([T["<Parallel>"], T["<Goal>"], T["<Outline>"], 60, T["</Outline>"], T["<Outline>"], 61,
              T["</Outline>"], T["</Goal>"]], 5),
            (_path(1) + [T["<Parallel>"], T["<Goal>"], T["<Outline>"], 63, T["</Outline>"], T["<Outline>"], 64,
                         T["</Outline>"], T["</Goal>"]], 14),
            (_path(1) + [90, T["</Path>"]], 26), (_path(2) + [91, 92, T["</Path>"]], 26),
            ([T["<Conclusion>"], 93, T["</Conclusion>"], T["</Parallel>"], 94, T["</Path>"]], 32),
            (_path(2) + [82, T["</Path>"]], 14),
            ([T["<Conclusion>"], 70, T["</Conclusion>"], T["</Parallel>"]], 38)],
    # the prefill + 8 + 1 (fork) + 8 along outer path 1 + 1 (nested fork) + 2 along nested path 2 + 1 (nested merge) + 4 + 1
    # (merge) + 3
    nfe=30)
SCRIPTS = {"flat": FLAT, "nested": NESTED}


@dataclasses.dataclass(frozen=True)
class Scripted(Multiverse):
    """Chooses the scripted token for (path, position); anything else is a test failure (token 0)."""

    script: str = "flat"

    def choose(self, logits, key, temperature, *, path, position):
        table = np.zeros((4, 64), np.int32)
        for p, chosen in SCRIPTS[self.script]["choices"].items():
            for at, token in chosen.items():
                table[p, at] = token
        return jnp.asarray(table)[jnp.clip(path, 0, 3), jnp.clip(position, 0, 63)]


def _policy(**settings):
    return Scripted(tag_base=101, digit_ids=DIGITS, colon_id=COLON, newlines=False, **settings)


def _merged_text(script):
    """The merged answer in text order and each token's position, as training lays it out."""
    tokens, positions = [], []
    for segment, start in SCRIPTS[script]["merged"]:
        tokens += segment
        positions += list(range(start, start + len(segment)))
    return tokens, positions


def _published_mask(tokens: list[int]) -> np.ndarray:
    """Causal, then every pair of different <Path> spans of one <Parallel> masked both ways (a stack walk)."""
    n = len(tokens)
    allowed = np.tril(np.ones((n, n), bool))
    parallels, starts = [], []  # per open <Parallel>: its path spans; the open <Path>s' starts
    for i, t in enumerate(tokens):
        if t == TAG["<Parallel>"]:
            parallels.append([])
        elif t == TAG["<Path>"]:
            starts.append(i)
        elif t == TAG["</Path>"]:
            parallels[-1].append((starts.pop(), i))
        elif t == TAG["</Parallel>"]:
            spans = parallels.pop()
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
    config = SamplerConfig(gen_length=64, policy=_policy(**settings))
    return jaxdllm.generate(model, np.asarray(prompts), config)


@pytest.mark.parametrize("page_size", [3, 16])  # pages fill at every kind of moment: a fork, a merge, a prefix
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_fork_and_merge_write_the_merged_text_in_the_published_layout(checkpoint, script, page_size):
    model, _ = checkpoint
    result = _run(model, [PROMPT, PROMPT], script=script, page_size=page_size)
    tokens, _ = _merged_text(script)
    for row in result.generated:
        assert list(row[:len(tokens) + 1]) == tokens + [EOS]
        assert (row[len(tokens):] == EOS).all()
    assert list(result.nfe) == [SCRIPTS[script]["nfe"]] * 2


def test_a_request_without_rows_for_its_paths_goes_on_sequentially(checkpoint):
    model, _ = checkpoint
    # two paths at most: the three-outline fork is refused, the row writes on in its own block
    result = _run(model, [PROMPT], max_paths=2)
    assert result.generated[0][11] == TAG["</Goal>"]  # then the scripted root has nothing for position 17: 0
    assert result.generated[0][12] == 0


# the flat script in the slow run (the default run's 6-minute budget): the nested one holds a flat block too
@pytest.mark.parametrize("script,page_size", [pytest.param("flat", 16, marks=pytest.mark.slow), ("nested", 3)])
def test_the_merged_sequence_s_next_logits_equal_a_plain_forward_with_the_multiverse_mask(checkpoint, script,
                                                                                        page_size):
    model, hf = checkpoint
    policy = _policy(script=script, page_size=page_size)
    config = SamplerConfig(gen_length=64, policy=policy)

    prompt = jnp.asarray([PROMPT], jnp.int32)
    seg = jnp.ones_like(prompt)
    lay = Layout(prompt_len=5, total=5 + 64, mask_id=None, shift=0, eos_eot=(EOS,), eos_id=EOS, attention="causal")
    view = CanvasView.of(seg, 64)
    canvas = canvas_of(config)
    # jitted: eager calls dispatch op by op, each a compile of its own on CPU
    state = jax.jit(lambda p: canvas.init(model, p, view, jax.random.key(0), lay, config, jnp.ones((1,), bool)))(prompt)
    step = jax.jit(lambda s: canvas.step(model, s, view, lay, config).replace(step=s.step + 1))
    while not bool(state.done[0]):
        state = step(state)
    f = state.cache
    extra = 90  # one more token after the merged text, at the root's next position, in its last page
    entries = jnp.arange(f.view_pages.shape[1])[None] < f.n_view[:1, None]
    assert int(f.fill[0]) < policy.page_size
    shared = SharedView(view_blocks=jnp.where(entries, f.view_pages[:1], -1), view_offsets=f.view_offsets[:1],
                        write_block=f.view_pages[0, f.n_view[0] - 1][None], write_slot=f.fill[:1],
                        q_valid=jnp.ones((1, 1), bool))
    ours = forward(model, jnp.asarray([[extra]]), f.pos[:1, None], shared, f.kv).logits[0, 0]
    tokens, positions = _merged_text(script)
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


def test_the_published_engine_feeds_newlines_around_the_path_tag():
    policy = Multiverse(tag_base=101, digit_ids=DIGITS, colon_id=COLON, newline_id=5)
    assert policy.path_feed(12) == (5, TAG["<Path>"], 5, DIGITS[1], DIGITS[2], COLON)
    assert policy.conclusion_feed() == (TAG["<Conclusion>"], 5)
    assert dataclasses.replace(policy, newlines=False).path_feed(3) == (TAG["<Path>"], DIGITS[3], COLON)
