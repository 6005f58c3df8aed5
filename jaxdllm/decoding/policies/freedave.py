"""FreeDave (Free Draft-and-Verification; `algorithms.md` §10): lossless parallel decoding of masked
diffusion models. The policy holds the settings and the per-step arithmetic; the canvas that runs it
(forwards, seeds, layouts, the KV cache) is `jaxdllm.decoding.freedave_canvas`.

The reference is a greedy sampler of the masked canvas: `reference="llada"` is LLaDA's
low-confidence sampler at one token per step (`steps = gen_length`), `reference="threshold"`
Fast-dLLM's threshold rule. Each step starts from the logits of the current canvas (the *seed*):

* drafts (`draft_commits`): draft 1 is the reference's own step from the seed; draft k adds the
  k - 1 next most confident masked positions of the block (ranked by the seed, as the reference
  ranks: `rank_among`, ties to the lower position), each with the seed's greedy token.
* one forward over the K drafts gives each draft's logits; target(i) is the reference's step from
  draft i's logits (`ConfidencePolicy.commit` of the reference policy itself, so its tie rule and
  options, `confidence_eos_eot_inf` included, are the reference's).
* chained verification (`verify`): best = draft 1; for j = 2..K, if draft j agrees with
  target(best), best = j. `match_rule="exact_match"`: equal on every position of the block;
  `"subset"`: equal where draft j has decided a position (the published rule for threshold
  decoding: draft j may decide fewer positions than target(best)).
* draft `best` is committed and its logits, already computed, seed the next step.

With `exact_match` every committed canvas is one the reference visits, so the output is the
reference's (with either reference). With `subset` and the threshold reference a draft that decides
a strict subset of the target's positions is accepted, so the canvas can leave the threshold
sampler's path: faster, not identical (the published FreeDave++ trade-off); with the llada
reference `subset` equals `exact_match` (a draft that agrees decides exactly the target's one more
position).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import ConfidencePolicy, StepContext, in_unit_interval, rank_among
from jaxdllm.decoding.policies.llada import Llada
from jaxdllm.decoding.policies.threshold import Threshold
from jaxdllm.errors import ConfigError

REFERENCES = ("llada", "threshold")
MATCH_RULES = ("exact_match", "subset")
DRAFT_LAYOUTS = ("batch", "tree", "sequential")


@dataclasses.dataclass(frozen=True)
class FreeDave(ConfidencePolicy):
    """FreeDave's settings.

    Attributes:
      drafts: K, drafts verified per forward (at most K tokens committed per forward with the llada
        reference). 4 is the published default for LLaDA (its eval wrapper and script; Dream and
        TraDo use 8).
      match_rule: `exact_match` (lossless) or `subset` (see the module notes).
      reference: the sampler whose output FreeDave reproduces: `llada` (one token per step, low
        confidence) or `threshold` (top-1 plus every position with p >= `threshold`).
      threshold: the threshold reference's bar (Fast-dLLM's 0.9).
      draft_layout: how the K drafts share one forward. `batch`: B*K rows, each a whole canvas
        (cache='none') or a window over its own copy of the cache (cache='block'). `tree`: with
        cache='block', one row per prompt holding the K draft windows as nodes of a tree mask over
        the shared cached prefix (`MaskSpec(kind="tree")`); a bidirectional model without a cache
        has nothing to share (every K/V depends on the whole canvas), so `tree` needs the block
        cache. `batch` is the default: on CPU it was the faster of the two at every K measured
        (`sampling/benchmarks/freedave_layouts.py`, `sampling/results/freedave/`). Each
        tree node's dense attention scores the K - 1 windows it masks out and the LM head runs over
        every node, which there costs more than the batch layout's per-step copies of the cache.
        `sequential`: the K drafts one after another, each a forward of the reference's own shapes
        (B rows), the role of the published code's determinism helper: where a model's numerics
        depend on the batch shape (bf16 on CPU), the batch layout's B*K rows can round a near-tie
        differently from the reference's B rows, and this layout gives the reference's logits bit
        for bit. NFE counts its K forwards once, as the one forward of the other layouts (they do
        not depend on each other); its wall time on an accelerator is K forwards'.
      confidence_eos_eot_inf: passed to the reference (EOS/EoT committed last).
    """

    drafts: int = 4
    match_rule: str = "exact_match"
    reference: str = "llada"
    threshold: float = 0.9
    draft_layout: str = "batch"
    name = "freedave"
    canvas = "freedave_canvas"

    def check(self, config) -> None:
        """`ConfigError` for bad settings and what FreeDave cannot reproduce (sampling, CFG, an
        approximate cache, the tree layout without the block cache)."""
        if isinstance(self.drafts, bool) or not isinstance(self.drafts, int) or self.drafts < 1:
            raise ConfigError(f"drafts must be an integer >= 1, got {self.drafts!r} (policy 'freedave'; "
                              "the published default is 4)")
        for value, allowed, setting in ((self.match_rule, MATCH_RULES, "match_rule"),
                                        (self.reference, REFERENCES, "reference"),
                                        (self.draft_layout, DRAFT_LAYOUTS, "draft_layout")):
            if value not in allowed:
                raise ConfigError(f"{setting} must be one of {allowed}, got {value!r} (policy 'freedave')")
        in_unit_interval(self.threshold, "threshold", self.name)
        if config.temperature != 0:
            raise ConfigError("policy 'freedave' reproduces greedy decoding: use temperature=0 (for sampling, "
                              "policy='llada' or 'threshold')")
        if config.cfg_scale > 0:
            raise ConfigError("policy 'freedave' verifies drafts without classifier-free guidance: use cfg_scale=0 "
                              "(for CFG, policy='llada' with cache='none')")
        # an approximate cache is refused by the FreeDave canvas (`freedave_canvas.py`)
        if self.draft_layout == "tree" and not (config.cache.exact and config.cache.keeps_kv):
            raise ConfigError("draft_layout='tree' shares the cached prefix of a block-causal model (cache='block'); "
                              "without a cache every K/V depends on the whole canvas and nothing is shared: use "
                              "draft_layout='batch'")

    def reference_policy(self) -> ConfidencePolicy:
        """The policy whose step FreeDave verifies against (`Llada` or `Threshold`)."""
        if self.reference == "threshold":
            return Threshold(threshold=self.threshold, confidence_eos_eot_inf=self.confidence_eos_eot_inf)
        return Llada(confidence_eos_eot_inf=self.confidence_eos_eot_inf)

    def reference_config(self, config):
        """The `SamplerConfig` of the reference sampler for `config` (a FreeDave config): the same
        loop settings and cache, the reference policy, one token per step for `llada`.
        FreeDave with `match_rule="exact_match"` returns `generate(model, ids, reference_config(config))`'s
        tokens."""
        return config.replace(policy=self.reference_policy(), steps=config.gen_length)


def draft_commits(reference: ConfidencePolicy, seed_logits: jax.Array, candidates: jax.Array, ctx: StepContext,
                  drafts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The K drafts of one step from the seed.

    Args:
      reference: the reference policy; seed_logits: `[B, L, V]` logits of the current canvas over the
        block; candidates: `[B, L]` the block's undecided positions (rows still decoding);
      ctx: the reference's `StepContext`; drafts: K.

    Returns:
      `(commits [B, K, L] bool, tokens [B, L] int32, distinct [B] int32)`: draft k (index k - 1)
      commits the reference's step plus the k - 1 next candidates by the seed's confidence, each
      with `tokens` (the seed's greedy tokens); `distinct` is how many drafts differ (drafts past
      the block's candidates repeat the full block).
    """
    decision = reference.commit(seed_logits, candidates, ctx)
    base = decision.commit & candidates
    _, conf = reference.greedy(seed_logits, ctx)
    rest = candidates & ~base
    rank = rank_among(conf, rest)                                      # [B, L]
    extra = jnp.arange(drafts, dtype=jnp.int32)[None, :, None]         # draft k adds k - 1
    commits = base[:, None] | (rest[:, None] & (rank[:, None] < extra))
    distinct = jnp.minimum(drafts, rest.sum(1).astype(jnp.int32) + 1)
    return commits, decision.tokens.astype(jnp.int32), distinct


def target_commits(reference: ConfidencePolicy, logits: jax.Array, candidates: jax.Array,
                   ctx: StepContext) -> tuple[jax.Array, jax.Array]:
    """The reference's step from each draft: `logits [B, K, L, V]`, `candidates [B, K, L]` (each
    draft's undecided block positions) -> `(commit [B, K, L] bool, tokens [B, K, L] int32)`."""
    b, k, length, v = logits.shape
    decision = reference.commit(logits.reshape(b * k, length, v), candidates.reshape(b * k, length), ctx)
    commit = (decision.commit & candidates.reshape(b * k, length)).reshape(b, k, length)
    return commit, decision.tokens.reshape(b, k, length).astype(jnp.int32)


def verify(drafts: jax.Array, targets: jax.Array, decided: jax.Array, distinct: jax.Array, match_rule: str,
           stopped: jax.Array | None = None) -> jax.Array:
    """Chained verification: the index of the accepted draft per row, `[B]` int32 (0 = draft 1).

    Args:
      drafts: `[B, K, L]` each draft's block (MASK where undecided); targets: `[B, K, L]` the
        reference's step from each draft (the same layout); decided: `[B, K, L]` the positions each
        draft has decided (read by `subset`); distinct: `[B]` the drafts that differ (later ones
        are never accepted); match_rule: `exact_match` or `subset`.
      stopped: `[B, K]` drafts at which the reference would stop (an EOS with everything before it
        decided, `stop_at_eos=True`): the chain does not go past one.

    best = 0; for j = 1..K-1: if draft j agrees with target(best), best = j.
    """
    same = drafts[:, None, :, :] == targets[:, :, None, :]           # [B, i (target), j (draft), L]
    if match_rule == "subset":
        same = same | ~decided[:, None, :, :]
    agree = same.all(-1)                                              # [B, K, K]
    rows = jnp.arange(drafts.shape[0])
    best = jnp.zeros(drafts.shape[0], jnp.int32)
    for j in range(1, drafts.shape[1]):
        ok = agree[rows, best, j] & (j < distinct)
        if stopped is not None:
            ok = ok & ~stopped[rows, best]
        best = jnp.where(ok, j, best)
    return best
