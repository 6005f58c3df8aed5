"""Lookahead decoding (Fu et al., 2024) equals greedy autoregressive decoding, the published
property, checked against transformers' `generate(do_sample=False)` on tiny random Qwen2 and
Llama checkpoints; it accepts several tokens per forward where the text repeats; its n-gram pool
follows the published rules (checked against a dictionary written out here); the accepted
branch's K/V are what keeps the cache exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.decoding.policies import Lookahead
from support.optional import torch, transformers
from support.sampler_fixtures import prompts
from test_jacobi import PAD, assert_greedy_up_to_eos, hf_greedy, saved  # noqa: F401  (saved: the checkpoint fixture)


SETTINGS = {"published": {}, "small": {"level": 3, "window_size": 4, "guess_set_size": 2, "pool_capacity": 8},
            "from_prompt": {"level": 4, "window_size": 5, "guess_set_size": 3, "pool_from_prompt": True}}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_lookahead_equals_transformers_greedy(saved, setting):
    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    gen = 40
    ids, mask, _ = prompts([3, 9, 6], seed=11, vocab=hf.config.vocab_size)
    want = hf_greedy(hf, ids, mask, gen)
    config = SamplerConfig(policy=Lookahead(**SETTINGS[setting]), gen_length=gen, prompt_bucket=8)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    np.testing.assert_array_equal(out.tokens[:, ids.shape[1]:], want)
    level = config.policy.level
    assert (out.nfe <= gen).all() and (out.nfe >= -(-gen // level)).all()
    steps = out.commit_step[:, ids.shape[1]:]
    assert (np.diff(steps, axis=1) >= 0).all() and (steps.max(1) == out.nfe).all()  # decided left to right
    per_step = np.stack([np.bincount(s, minlength=gen + 1)[1:] for s in steps])
    assert per_step.max() <= level  # at most the n-gram's N - 1 tokens plus the prediction after them


@pytest.mark.slow  # the default run's 6-minute budget
def test_repeated_text_is_accepted_several_tokens_a_forward_and_the_kv_move_keeps_it_exact(saved, monkeypatch):
    """Random tiny models fall into loops; the pool learns the loop's n-grams and later steps accept
    them whole, with the same greedy tokens. Without moving the accepted branch's K/V into place
    the cache goes wrong and the tokens differ: the test can fail."""
    from jaxdllm.models.cache import KVCache

    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    gen = 48
    ids, mask, _ = prompts([3, 9, 6], seed=gen, vocab=hf.config.vocab_size)
    want = hf_greedy(hf, ids, mask, gen)
    config = SamplerConfig(policy=Lookahead(level=4, window_size=6, guess_set_size=4), gen_length=gen,
                           prompt_bucket=8)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    np.testing.assert_array_equal(out.tokens[:, ids.shape[1]:], want)
    assert out.nfe.sum() < 0.8 * gen * len(ids), out.nfe
    monkeypatch.setattr(KVCache, "move_slots", lambda self, source, dest, length: self)
    broken = jaxdllm.generate(model, ids, config.replace(prompt_bucket=16), attention_mask=mask)
    assert not np.array_equal(broken.tokens[:, -gen:], want)


def test_lookahead_stops_rows_at_their_eos(saved):
    hf, path = saved
    gen = 24
    ids, mask, _ = prompts([4, 7], seed=3, vocab=hf.config.vocab_size)
    plain = hf_greedy(hf, ids, mask, gen)
    eos = int(plain[0, 9])
    want = hf_greedy(hf, ids, mask, gen, eos=eos)
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD, eos_token_id=eos)
    out = jaxdllm.generate(model, ids, SamplerConfig.preset("lookahead", gen_length=gen, prompt_bucket=8),
                           attention_mask=mask)
    assert_greedy_up_to_eos(out.tokens[:, ids.shape[1]:], want, eos)


class DictPool:
    """The pool as the published implementation keeps it: a dict from first token to a list of
    continuations, at most G per key (the oldest goes), no duplicates; plus our overall capacity
    (the oldest entry of all goes)."""

    def __init__(self, guesses, capacity):
        self.guesses, self.capacity, self.entries = guesses, capacity, []  # (key, gram) oldest first

    def add(self, key, gram):
        if (key, gram) in self.entries:
            return
        same = [e for e in self.entries if e[0] == key]
        if len(same) >= self.guesses:
            self.entries.remove(same[0])
        elif len(self.entries) >= self.capacity:
            self.entries.pop(0)
        self.entries.append((key, gram))

    def lookup(self, key):
        return [g for k, g in reversed(self.entries) if k == key][:self.guesses]


def test_pool_keeps_guess_set_size_per_key_without_duplicates_newest_first():
    policy = Lookahead(level=3, window_size=2, guess_set_size=3, pool_capacity=6)
    ids = jnp.zeros((2, 4), jnp.int32)
    _, state = policy.start(ids, jnp.ones((2, 4), jnp.int32), 8, jax.random.PRNGKey(0))
    ref = [DictPool(3, 6), DictPool(3, 6)]
    rng = np.random.RandomState(0)
    remember = jax.jit(policy.remember)  # eager calls dispatch op by op, a compile each on CPU
    propose = jax.jit(lambda state, last: policy.propose(state, last, None))
    for _ in range(60):
        key = rng.randint(0, 3, 2)
        gram = rng.randint(0, 3, (2, 2))
        store = rng.rand(2) < 0.8
        state = remember(state, jnp.asarray(key), jnp.asarray(gram), jnp.asarray(store))
        for row in range(2):
            if store[row]:
                ref[row].add(int(key[row]), tuple(int(t) for t in gram[row]))
        for last in range(3):
            proposal = propose(state, jnp.full((2,), last, jnp.int32))
            for row in range(2):
                got = [tuple(int(t) for t in g) for g, ok in zip(proposal.branches[row], proposal.valid[row]) if ok]
                assert got == ref[row].lookup(last), (row, last)


def test_lookahead_settings_are_checked():
    for bad, match in (({"level": 1}, "level must be"), ({"window_size": 0}, "window_size"),
                       ({"guess_set_size": 4, "pool_capacity": 2}, "pool_capacity")):
        with pytest.raises(ConfigError, match=match):
            SamplerConfig(policy=Lookahead(**bad))
    with pytest.raises(ConfigError, match="greedy"):
        SamplerConfig(policy="lookahead", temperature=0.7)
    with pytest.raises(ConfigError, match="own exact KV cache"):
        SamplerConfig(policy="lookahead", cache="prefix")


def test_a_draft_and_verify_policy_defined_outside_plugs_into_the_loop(saved):
    """Prompt lookup decoding (drafts copied from the prompt after the last token's latest earlier
    occurrence), written here against the interface alone: the engine runs it unchanged and its
    output is greedy decoding's."""
    import dataclasses

    from jaxdllm.decoding import register_policy
    from jaxdllm.decoding.policies import DraftVerifyPolicy, VerifyLayout
    from jaxdllm.decoding.policies.draft_verify import Proposal

    @dataclasses.dataclass(frozen=True)
    class PromptLookup(DraftVerifyPolicy):
        draft_tokens: int = 3
        name = "test_prompt_lookup"

        def layout(self):
            return VerifyLayout(levels=0, width=0, branches=1, branch_len=self.draft_tokens)

        def start(self, prompt, seg, gen_length, key):
            return jnp.broadcast_to(prompt[:, -1:], (prompt.shape[0], gen_length)), prompt.astype(jnp.int32)

        def propose(self, prompt, last, draft):
            lp, k = prompt.shape[1], self.draft_tokens
            hits = (prompt[:, :lp - k] == last[:, None])
            at = jnp.where(hits.any(1), lp - k - 1 - jnp.argmax(hits[:, ::-1], axis=1), 0)
            branch = jax.vmap(lambda row, i: jax.lax.dynamic_slice_in_dim(row, i + 1, k))(prompt, at)
            return Proposal(jnp.zeros((len(last), 0), jnp.int32), branch[:, None], hits.any(1)[:, None])

    register_policy(PromptLookup)
    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    gen = 20
    ids, mask, _ = prompts([12, 16], seed=5, vocab=hf.config.vocab_size)
    want = hf_greedy(hf, ids, mask, gen)
    out = jaxdllm.generate(model, ids, SamplerConfig(policy="test_prompt_lookup", gen_length=gen,
                                                     prompt_bucket=8), attention_mask=mask)
    np.testing.assert_array_equal(out.tokens[:, ids.shape[1]:], want)
    assert (out.nfe <= gen).all()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) for n in ("tasks-qwen2-small", "tasks-qwen2-small-jf")])
def test_lookahead_on_the_shipped_causal_models_equals_transformers_greedy(name):
    """The published setting (and the prompt-pool variant) on the shipped models, held-out suite
    prompts: token for token transformers' greedy decoding up to EOS."""

    from jaxdllm.data import make_mixture

    model, tok, _ = jaxdllm.load(name, dtype="float32")
    path = jaxdllm.checkpoint_dir(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    examples = make_mixture(["copy", "reverse_long", "sort", "add"], 2, seed=7, split="test")
    encode = (lambda text: tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True)) \
        if tok.chat_template else tok.encode
    rows = [encode(e.prompt) for e in examples]
    gen, eos = 32, model.config.eos_token_id
    width = max(map(len, rows))
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    wants = []
    for row in rows:
        with torch.no_grad():
            prompt = torch.as_tensor([row])
            want = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=gen,
                               do_sample=False, eos_token_id=eos, pad_token_id=eos)[0, len(row):].numpy()
        wants.append(want[:int(np.argmax(want == eos)) + 1] if (want == eos).any() else want)
    for extra in ({}, {"pool_from_prompt": True}):
        config = jaxdllm.sampler_defaults(name, "lookahead", gen_length=gen, **extra)
        out = jaxdllm.generate(model, ids, config, attention_mask=mask)
        for i, want in enumerate(wants):
            np.testing.assert_array_equal(out.tokens[i, width:width + len(want)], want)
