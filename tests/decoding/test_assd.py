"""ASSD (any-subset speculative decoding) on a tiny random XLNet: its samples follow sequential sampling
under the order (a chi-squared test that a wrong acceptance rule fails), its forwards never exceed its
tokens, greedy ASSD is sequential greedy decoding token for token (alone, in a ragged batch, and on an
infill), and its settings fail early with actionable errors.

The sequential reference here is written from the published procedure, not from the canvas: one
target at a time, every visible token and every earlier-ranked masked position attendable, the MASK
token's probability removed and the rest renormalised (float64)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.decoding.policies.assd import Assd, Verdict
from jaxdllm.models.families.xlnet import XLNetLM, xlnet_config

V, MASK, BOS, EOS, PAD = 8, 6, 1, 2, 5
TOKENS = [t for t in range(V) if t != MASK]  # what a position can take
N = 6000  # rows of the sampled run (one compiled call)
PROMPT = [BOS, 3, 7]
G = 4  # generated tokens of the sampled run: ranks 0..3, drafted 3 at a time


def tiny_xlnet(seed: int = 0, scale: float = 8.0, keep: tuple[str, ...] = ("norm",)) -> XLNetLM:
    """A tiny XLNet with a vocabulary of 8, every random parameter times `scale` except those under a module
    or parameter named in `keep`: with the defaults its conditionals are spread over the tokens and depend on
    the tokens before them (what the chi-squared test needs); at 30, the feed-forwards and the query
    stream's start kept, its greedy continuations vary with the context (drafts the verifier rejects)."""
    config = xlnet_config(vocab_size=V, d_model=32, n_layer=2, n_head=2, d_inner=64, max_position=64,
                          mask_token_id=MASK, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model = XLNetLM(config, rngs=nnx.Rngs(seed))

    def scaled(path, x):
        names = {str(getattr(k, "key", getattr(k, "name", k))) for k in path}
        return x if names & set(keep) else x * scale

    nnx.update(model, jax.tree_util.tree_map_with_path(scaled, nnx.state(model, nnx.Param)))
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_xlnet()


@pytest.fixture(scope="module")
def greedy_model():
    return tiny_xlnet(scale=30.0, keep=("norm", "ff", "mask_emb"))


# -- the sequential reference ---------------------------------------------------------------------------

def reference_perm(row, width: int | None = None) -> np.ndarray:
    """`[W, W]` bool perm mask (True: i may not attend to j) of the published order for `row`, right-padded to
    `width` columns that nobody attends to: visible tokens (not MASK) are seen by every position; the masked
    positions, ranked left to right, are seen by the masked positions ranked after them."""
    masked = [i for i, t in enumerate(row) if t == MASK]
    rank = {pos: r for r, pos in enumerate(masked)}
    width = width or len(row)
    perm = np.ones((width, width), bool)
    for i in range(width):
        for j in range(len(row)):
            if j not in rank or (i in rank and rank[i] > rank[j]):
                perm[i, j] = False
    return perm


@functools.cache
def _jitted_two_stream(model):
    graphdef, params = nnx.split(model)
    call = jax.jit(lambda p, ids, perm, targets: nnx.merge(graphdef, p).two_stream(ids, perm, targets))
    return functools.partial(call, params)


def conditionals(model, rows: np.ndarray, perms: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`[N, V]` float64 distribution of position `positions[n]` of each of `rows [N, W]` under `perms
    [N, W, W]`, one target per row, MASK removed and renormalised (T = 1)."""
    logits = np.asarray(_jitted_two_stream(model)(jnp.asarray(rows, jnp.int32), jnp.asarray(perms),
                                                  jnp.asarray(positions, jnp.int32)[:, None]), np.float64)[:, 0]
    logits[:, MASK] = -np.inf
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sequential_joint(model, prompt, length: int) -> np.ndarray:
    """`[V] * length` float64: the probability of every answer of `length` tokens after `prompt` under
    sequential sampling at T = 1 (every prefix's conditional: one forward per prefix, V^(length-1) rows each
    step, the first steps' prefixes repeated to fill them)."""
    row = list(prompt) + [MASK] * length
    rows = V ** (length - 1)
    perms = np.broadcast_to(reference_perm(row), (rows, len(row), len(row)))
    joint = np.ones((1,), np.float64)
    prefixes = np.asarray([row])
    for step in range(length):
        pos = len(prompt) + step
        filled = np.resize(prefixes, (rows, len(row)))
        probs = conditionals(model, filled, perms, np.full(rows, pos))[:len(prefixes)]      # [P, V]
        joint = (joint[:, None] * probs).reshape(-1)
        prefixes = np.repeat(prefixes, V, 0)
        prefixes[:, pos] = np.tile(np.arange(V), len(prefixes) // V)
    return joint.reshape((V,) * length)


def sequential_greedy(model, rows, stop_at_eos: bool) -> list[list[int]]:
    """Each of `rows` (MASK where undecided, no padding) decoded greedily one masked position at a time, left
    to right (the rows in lockstep, right-padded to one width with columns nobody attends to); with
    `stop_at_eos`, once an EOS at or after a row's first masked column has nothing undecided before it, the
    rest of that row becomes EOS."""
    rows = [list(r) for r in rows]
    width = max(map(len, rows))
    perms = np.stack([reference_perm(r, width) for r in rows])
    masked = [[i for i, t in enumerate(r) if t == MASK] for r in rows]
    stopped = [False] * len(rows)
    for step in range(max(map(len, masked))):
        ids = np.asarray([r + [PAD] * (width - len(r)) for r in rows])
        targets = np.asarray([m[step] if step < len(m) else 0 for m in masked])
        picks = conditionals(model, ids, perms, targets).argmax(-1)
        for r, row in enumerate(rows):
            if step >= len(masked[r]) or stopped[r]:
                continue
            row[targets[r]] = int(picks[r])
            eos = [c for c in range(masked[r][0], len(row)) if row[c] == EOS]
            if stop_at_eos and eos and MASK not in row[:eos[0]]:
                rows[r], stopped[r] = [EOS if t == MASK else t for t in row], True
    return rows


# -- sampling: the joint of the generated tokens against the sequential one ------------------------------

@dataclasses.dataclass(frozen=True)
class AlwaysAccept(Assd):
    """A wrong rule (test only): every draft kept, nothing resampled."""

    def accept(self, drafts, q, p, valid, key):
        return Verdict(valid.sum(1).astype(jnp.int32), drafts)


@dataclasses.dataclass(frozen=True)
class ResampleFromP(Assd):
    """A wrong rule (test only): U < p/q as published, but the first rejected slot drawn from p, not from the
    residual max(p - q, 0)."""

    def accept(self, drafts, q, p, valid, key):
        return _resample_from_p(drafts, q, p, valid, key)


def _resample_from_p(drafts, q, p, valid, key):
    """`Assd.accept` with the residual replaced by p (the wrong rule of `ResampleFromP`)."""
    k = drafts.shape[1]
    u_key, r_key = jax.random.split(key)
    u = jax.random.uniform(u_key, drafts.shape)
    q_y = jnp.take_along_axis(q, drafts[..., None], -1)[..., 0]
    p_y = jnp.take_along_axis(p, drafts[..., None], -1)[..., 0]
    keep = (u * q_y < p_y).at[:, 0].set(True) | ~valid
    first = jnp.where(keep.all(1), k, jnp.argmin(keep, axis=1))
    count = valid.sum(1)
    p_f = jnp.take_along_axis(p, jnp.clip(first, 0, k - 1)[:, None, None], 1)[:, 0]
    fix = jax.random.categorical(r_key, jnp.log(p_f)).astype(jnp.int32)
    tokens = jnp.where(jnp.arange(k)[None] == first[:, None], fix[:, None], drafts)
    return Verdict(jnp.where(first < count, first + 1, count).astype(jnp.int32), tokens)


def sample_config(policy=None) -> SamplerConfig:
    return SamplerConfig(policy=policy or Assd(drafts=3), gen_length=G, temperature=1.0, prompt_bucket=1)


def run_sampled(model, policy=None, seed: int = 0):
    ids = np.repeat(np.asarray([PROMPT], np.int32), N, 0)
    return jaxdllm.generate(model, ids, sample_config(policy), key=jax.random.PRNGKey(seed))


@pytest.fixture(scope="module")
def sampled(model):
    """The one big compiled run: N rows of one prompt, G tokens each, 3 drafts per iteration, T = 1."""
    return run_sampled(model)


@pytest.fixture(scope="module")
def exact(model):
    return sequential_joint(model, PROMPT, G)


def pair_chi2(generated: np.ndarray, exact: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """`(statistic, p-value)` of Pearson's chi-squared test of the joint of generated tokens `a` and `b`
    (`generated [N, G]`) against the exact joint's marginal over them; cells expected below 5 pooled."""
    axes = tuple(i for i in range(exact.ndim) if i not in (a, b))
    expected = exact.sum(axis=axes).reshape(-1) * len(generated)
    observed = np.bincount(generated[:, a] * V + generated[:, b], minlength=V * V).astype(np.float64)
    assert observed[expected == 0].sum() == 0, "a pair of probability 0 was sampled (MASK never is)"
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    statistic, p_value = stats.chisquare(obs[keep], exp[keep])
    return float(statistic), float(p_value)


PAIRS = [(0, 1), (1, 2), (2, 3)]
P_MIN = 1e-3  # fixed seeds: the statistic is a fixed number; the right rule must clear this for every pair


def test_samples_follow_sequential_sampling_under_the_order(sampled, exact):
    generated = np.asarray(sampled.generated)
    assert not (generated == MASK).any()
    for a, b in PAIRS:
        statistic, p_value = pair_chi2(generated, exact, a, b)
        print(f"assd pair {a, b}: chi2 {statistic:.1f}, p {p_value:.3g}")
        assert p_value > P_MIN, (a, b, statistic, p_value)
    # the exact joint is spread: a wrong rule has something to get wrong
    assert exact.max() < 0.05 and (exact.sum(axis=(2, 3)) * N >= 5).sum() >= 40


@pytest.mark.parametrize("wrong", [AlwaysAccept(drafts=3),
                                   pytest.param(ResampleFromP(drafts=3), marks=pytest.mark.slow)],
                         ids=["always-accept", "resample-from-p"])
def test_the_chi_squared_test_rejects_a_wrong_acceptance_rule(model, exact, wrong):
    generated = np.asarray(run_sampled(model, wrong).generated)
    worst = min(pair_chi2(generated, exact, a, b)[1] for a, b in PAIRS)
    print(f"{type(wrong).__name__}: smallest p-value {worst:.3g}",
          [round(pair_chi2(generated, exact, a, b)[0], 1) for a, b in PAIRS])
    assert worst < P_MIN * 1e-3  # the test above fails it, with room to spare


# -- forwards and accepted drafts ------------------------------------------------------------------------

def test_forwards_never_exceed_tokens_and_the_first_draft_is_always_kept(sampled):
    """Every iteration of a row writes at least 2 tokens for its 2 forwards (its first draft kept, the
    second kept or resampled), and only a last single rank costs 1 forward; so nfe <= G."""
    nfe, steps = np.asarray(sampled.nfe), np.asarray(sampled.commit_step)[:, len(PROMPT):]
    assert (nfe <= G).all() and (steps.max(1) == nfe).all()
    for row_nfe, row in zip(nfe[:500], steps[:500]):
        values, counts = np.unique(row, return_counts=True)
        gaps = np.diff(np.concatenate([[0], values]))
        assert set(gaps[:-1]) == {2} or len(gaps) == 1, row
        assert (counts[gaps == 2] >= 2).all() and (counts[gaps == 1] == 1).all(), row
        assert gaps[-1] in (1, 2) and row_nfe == values[-1]
    print(f"tokens per forward: {N * G / nfe.sum():.3f} (mean nfe {nfe.mean():.2f} for {G} tokens)")


def test_the_first_slot_is_kept_even_where_the_verifier_gives_it_no_mass():
    policy = Assd(drafts=3)
    q = jnp.full((2, 3, V), 1.0 / V)
    p = jnp.zeros((2, 3, V)).at[..., 0].set(1.0)  # p(y) = 0 for every draft below
    drafts = jnp.array([[4, 4, 4], [5, 3, 3]], jnp.int32)
    accept = jax.jit(policy.accept)  # eager calls dispatch op by op, a compile each on CPU
    verdict = accept(drafts, q, p, jnp.array([[True] * 3, [True, True, False]]), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(verdict.written), [2, 2])  # slot 0 kept, slot 1 resampled
    np.testing.assert_array_equal(np.asarray(verdict.tokens[:, :2]), [[4, 0], [5, 0]])  # the residual is p's
    one = accept(drafts, q, p, jnp.array([[True, False, False]] * 2), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(one.written), [1, 1])


# -- greedy: sequential greedy decoding, alone, in a ragged batch, on an infill ---------------------------

GREEDY_ROWS = [
    [BOS, 4],
    [BOS, 3, 0, 7, 4],
    [BOS, 7, 3],
    [BOS, 3, 7, MASK, MASK, MASK, 4, EOS],  # an infill: prefix and suffix visible, the middle decoded
]
GREEDY = dict(gen_length=5, drafts=3, prompt_bucket=8)


def left_padded(rows):
    width = max(map(len, rows))
    ids = np.full((len(rows), width), PAD, np.int32)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return ids, mask


@pytest.fixture(scope="module")
def greedy_batch(greedy_model):
    ids, mask = left_padded(GREEDY_ROWS)
    return jaxdllm.generate(greedy_model, ids, SamplerConfig.preset("assd-greedy", **GREEDY), attention_mask=mask)


def test_greedy_assd_is_sequential_greedy_alone_and_in_a_ragged_batch(greedy_model, greedy_batch):
    config = SamplerConfig.preset("assd-greedy", **GREEDY)
    width = max(map(len, GREEDY_ROWS))
    wants = sequential_greedy(greedy_model, [row + [MASK] * GREEDY["gen_length"] for row in GREEDY_ROWS], True)
    for i, (row, want) in enumerate(zip(GREEDY_ROWS, wants)):
        got = np.asarray(greedy_batch.tokens[i, width - len(row):]).tolist()
        assert got == want, (i, got, want)
        alone = jaxdllm.generate(greedy_model, np.asarray([row], np.int32), config)
        assert np.asarray(alone.tokens[0]).tolist() == want, i
        assert int(alone.nfe[0]) == int(greedy_batch.nfe[i])
    # a draft was rejected somewhere (the verifier's argmax written in its place): an iteration wrote fewer
    # ranks than it drafted
    rejected = []
    for i, row in enumerate(GREEDY_ROWS):
        steps = np.asarray(greedy_batch.commit_step[i, width - len(row):])
        decoded = np.sort(steps[np.asarray(row + [MASK] * GREEDY["gen_length"]) == MASK])
        left = len(decoded)
        for count in np.unique(decoded, return_counts=True)[1]:
            rejected.append(count < min(GREEDY["drafts"], left))
            left -= count
    assert any(rejected)


def test_an_infill_fills_the_middle_and_leaves_the_suffix(greedy_model, greedy_batch):
    """MASK tokens in the prompt are decoded too (ranked before the answer columns); the visible prefix and
    suffix stay; with the suffix's EOS and stop_at_eos, the answer columns after it are EOS from the start (no
    forward drafts or verifies them)."""
    row = GREEDY_ROWS[-1]
    width = max(map(len, GREEDY_ROWS))
    got = np.asarray(greedy_batch.tokens[-1, width - len(row):])
    middle = [i for i, t in enumerate(row) if t == MASK]
    visible = [i for i, t in enumerate(row) if t != MASK]
    np.testing.assert_array_equal(got[visible], np.asarray(row)[visible])
    assert not (got[middle] == MASK).any() and not (got[middle] == EOS).any()  # a setup guard (fixed seed)
    assert (got[len(row):] == EOS).all()  # stopped at the suffix's EOS
    steps = np.asarray(greedy_batch.commit_step[-1, width - len(row):])
    assert (steps[visible] == 0).all() and (steps[middle] >= 1).all()
    assert int(greedy_batch.nfe[-1]) <= len(middle)
    assert (steps[len(row):] == 0).all()


# -- settings ---------------------------------------------------------------------------------------------

def test_settings_fail_early_with_actionable_errors():
    with pytest.raises(ConfigError, match="drafts .* must be an integer >= 1"):
        SamplerConfig.preset("assd", drafts=0)
    with pytest.raises(ConfigError, match="leave cache='none'"):
        SamplerConfig.preset("assd", cache="prefix")
    with pytest.raises(ConfigError, match="use stop_at_eos=True"):
        SamplerConfig.preset("assd", stop_at_eos="block")
    with pytest.raises(ConfigError, match="drop block_length"):
        SamplerConfig.preset("assd", block_length=8)
    llada = jaxdllm.ModelConfig.preset("tiny-llada")
    config = SamplerConfig.preset("assd", gen_length=8)
    with pytest.raises(ConfigError, match="two-stream attention"):
        config.canvas.check_model(llada, config)
    assert SamplerConfig.preset("assd").policy.drafts == 5 and SamplerConfig.preset("assd").temperature == 1.0


# -- the shipped any-order model: ASSD decodes the task suite ---------------------------------------------

SHIPPED = "tasks-xlnet-small"
# the tasks it learned (greedy, 100 held-out prompts each: copy, reverse, sort, pick3 at 0.94-1.0, perm 0.57;
# add 0.01, left out)
TASK_PROMPTS = {"reverse": "reverse 4821=", "sort": "sort 93715=", "copy": "copy 2718=", "perm": "perm 4312=",
                "pick3": "pick 3 from 31425="}


@pytest.fixture(scope="module")
def shipped():
    if not (jaxdllm.checkpoint_dir(SHIPPED) / "config.json").is_file():
        pytest.skip(f"no shipped {SHIPPED} (a source checkout has it)")
    return jaxdllm.load(SHIPPED)


def test_assd_decodes_the_shipped_tasks_model_and_fills_an_infill(shipped):
    """Greedy ASSD answers every task's prompt right (each task's checker) in fewer forwards than tokens; an
    infill posed as text (`<mask>` where the middle goes, the suffix and its `<eos>` visible) gets its
    middle and nothing else changes."""
    from jaxdllm.data import get_task

    model, tok, defaults = shipped
    config = SamplerConfig.preset("assd-greedy", gen_length=defaults.gen_length)
    out = jaxdllm.generate(model, tok(list(TASK_PROMPTS.values())), config)
    answers = tok.answers(out)
    assert all(get_task(t).check(p, a) for (t, p), a in zip(TASK_PROMPTS.items(), answers)), answers
    decoded = np.asarray(out.commit_step)[:, out.prompt_len:].max(1)  # the forward of each row's last token
    eos = np.asarray(out.generated) == model.config.eos_token_id
    tokens = np.where(eos.any(1), eos.argmax(1) + 1, eos.shape[1])  # up to its EOS (the rest: filler)
    assert (np.asarray(out.nfe) <= tokens).all() and (np.asarray(out.nfe) == decoded).all()

    infill = tok(["reverse 4821=1<mask><mask>4<eos>", "copy 2718=<mask><mask>18<eos>"])
    filled = jaxdllm.generate(model, infill, config)
    texts = [tok.decode(row[:filled.prompt_len]) for row in np.asarray(filled.tokens)]
    assert [t.strip() for t in texts] == ["reverse 4821=1284", "copy 2718=2718"], texts
    assert (np.asarray(filled.generated) == model.config.eos_token_id).all()  # stopped at the suffix's EOS
    assert (np.asarray(filled.nfe) <= 2).all()


@pytest.mark.slow  # two more compiled loops over 120 held-out prompts
def test_on_the_shipped_model_greedy_assd_is_sequential_greedy_on_held_out_prompts(shipped):
    """k = 5 drafts per iteration and k = 1 (one forward per token: sequential greedy decoding under the
    order) give the same tokens on 20 held-out prompts of each task, in fewer forwards."""
    from jaxdllm.data import make_split

    model, tok, defaults = shipped
    prompts = [e.prompt for task in ("copy", "reverse", "sort", "add", "perm", "pick3")
               for e in make_split(task, 20, 1234, split="test")]
    config = SamplerConfig.preset("assd-greedy", gen_length=defaults.gen_length)
    fast = jaxdllm.generate(model, tok(prompts), config)
    one = jaxdllm.generate(model, tok(prompts), config.replace(drafts=1))
    np.testing.assert_array_equal(np.asarray(fast.tokens), np.asarray(one.tokens))
    assert np.asarray(fast.nfe).sum() < np.asarray(one.nfe).sum()


def test_one_compiled_loop_without_host_callbacks(model):
    """The whole generation traces to one jitted computation holding one while loop (the verify forward a
    `cond` inside it), with no host callback."""
    from jaxdllm.decoding import loop, sampler

    config = sample_config()
    ids = np.asarray([PROMPT, PROMPT], np.int32)
    prep = sampler.prepare(model.config, ids, None, config)
    graphdef, params = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda p, i, m, v: loop.decode(
        graphdef, p, i, m, v, jax.random.PRNGKey(0), canvas=config.canvas, lay=prep.lay, config=config))(
        params, prep.ids, prep.seg, prep.valid)
    text = str(jaxpr)
    assert [str(e.primitive) for e in jaxpr.jaxpr.eqns].count("jit") + \
        [str(e.primitive) for e in jaxpr.jaxpr.eqns].count("pjit") == 1
    assert text.count("while[") == 1 and "callback" not in text
