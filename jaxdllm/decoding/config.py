"""`SamplerConfig`: the loop's settings plus a policy object and a cache object, validated before
anything compiles.

The loop's own settings are fields here (`gen_length`, `block_length`, `steps`, `temperature`,
`cfg_scale`, `stop_at_eos`, `prompt_bucket`, `max_trajectory`). Everything specific to one
decoding rule lives in its policy (`jaxdllm.decoding.policies`) and everything specific to a
cache in its cache (`jaxdllm.decoding.caches`). The short, published spelling still works: a
keyword that is not a loop setting goes to the policy or the cache that owns it,

    SamplerConfig(policy="threshold", threshold=0.9)          # == policy=Threshold(threshold=0.9)
    SamplerConfig(cache="dual", cache_refresh_every_step=True)
    config.threshold                                          # reads the policy's setting

and a setting that neither the chosen policy nor the chosen cache uses is an error naming the
policies that do. A policy or cache object can be passed directly (`policy=MyPolicy(...)`), which
is how a policy or cache defined outside the package plugs in.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from jaxdllm.decoding import caches as caches_lib
from jaxdllm.decoding import policies as policies_lib
from jaxdllm.errors import ConfigError
from jaxdllm.validation import check_fields, require_positive_int

# The loop's own settings, with defaults (LLaDA's published `generate` defaults).
_LOOP_DEFAULTS = dict(gen_length=128, block_length=128, steps=128, temperature=0.0, cfg_scale=0.0,
                      stop_at_eos=False, prompt_bucket=32, max_trajectory=0)
_CACHE_PREFIX = "cache_"  # cache settings may be spelled with it: cache_refresh_every_step


def _route(settings: dict, owner, kind: str) -> tuple[Any, dict]:
    """`owner` with the settings it owns applied; returns (owner, settings left over)."""
    names = set(type(owner).settings())
    mine = {}
    for key in list(settings):
        name = key[len(_CACHE_PREFIX):] if kind == "cache" and key.startswith(_CACHE_PREFIX) else key
        if name in names:
            mine[name] = settings.pop(key)
    return (dataclasses.replace(owner, **mine) if mine else owner), settings


def setting_owners() -> dict[str, tuple[str, str]]:
    """The table of short spellings: every sampler keyword -> `(kind, owner)`, kind "loop", "policy" or
    "cache" (a cache setting also as `cache_<name>`), from the loop's settings and the registered
    policies and caches. Each keyword has one kind of owner; a keyword claimed by two kinds (a policy
    setting named like a cache's or a loop's) is a `ConfigError` naming both. Built once per state of
    the two registries (every `SamplerConfig` asks for it)."""
    registered = (tuple((n, id(c)) for n, c in policies_lib.POLICIES.items()),
                  tuple((n, id(c)) for n, c in caches_lib.CACHES.items()))
    return dict(_owners_table(registered))


@functools.lru_cache(maxsize=4)
def _owners_table(registered: tuple) -> tuple:
    """`setting_owners`' table as items, for one state of the registries (`registered`: its cache key)."""
    table = {name: ("loop", "the loop") for name in _LOOP_DEFAULTS}

    def claim(key: str, kind: str, owner: str) -> None:
        if key in table and table[key][0] != kind:
            raise ConfigError(f"sampler setting {key!r} belongs to {table[key][1]} and to {owner}: rename one of "
                              "them (each short spelling has one owner)")
        table.setdefault(key, (kind, owner))

    for name, cls in policies_lib.POLICIES.items():
        for setting in cls.settings():
            claim(setting, "policy", f"policy {name!r}")
    for name, cls in caches_lib.CACHES.items():
        for setting in cls.settings():
            claim(setting, "cache", f"cache {name!r}")
            claim(_CACHE_PREFIX + setting, "cache", f"cache {name!r}")
    return tuple(table.items())


def _owners_of(setting: str) -> tuple[str, list[str]]:
    """`("policy" | "cache", names)` of the registered pieces that take `setting` (names may be empty)."""
    policies = [name for name, cls in policies_lib.POLICIES.items() if setting in cls.settings()]
    if policies:
        return "policy", policies
    bare = setting[len(_CACHE_PREFIX):] if setting.startswith(_CACHE_PREFIX) else setting
    return "cache", [name for name, cls in caches_lib.CACHES.items() if bare in cls.settings()]


@dataclasses.dataclass(frozen=True, init=False)
class SamplerConfig:
    """Decoding settings; hashable, so it is a static argument of the compiled loop.

    Attributes:
      gen_length: tokens to generate G (all of them unless `stop_at_eos`).
      block_length: the diffusion block: the semi-autoregressive block (`gen_length` for one block
        over the canvas). Only canvases that decode in blocks take it (`Canvas.diffusion_blocks`);
        on the others (draft-and-verify policies, APD) a value other than the default is an error.
        Jacobi's draft window is the policy's own `window`.
      steps: total steps of the scheduled policies (`llada`, `prophet`, `learn2pd`, `dream`); a
        multiple of the number of blocks. Other policies run each block until it is decided.
      policy: a `Policy` (or its name): the commit rule and its settings.
      cache: a `Cache` (or its name): `none` (exact), `prefix` / `dual` (Fast-dLLM, approximate,
        refreshed per block; bidirectional models), `block` (exact K/V cache of finished blocks
        of block-causal models).
      temperature: 0 = greedy; > 0 samples (Gumbel-max, = softmax(logits / T)).
      cfg_scale: classifier-free guidance `u + (cfg + 1)(c - u)`, u with the prompt masked
        (cache `none` only).
      stop_at_eos: False: every row decodes all of its answer (the published LLaDA sampler).
        True: a row stops once it has decided EOS and everything before it. "block": a row stops
        once the block that holds its EOS is finished (the published LLaDA2 loops; diffusion
        blocks only). A stopped row's remaining answer is EOS.
      prompt_bucket: prompts are left-padded to a multiple of this (block-causal models: the
        whole blocks before the first decoded block, to a multiple of its lcm with the blocks), so a
        new prompt in the same bucket reuses the compiled loop.
      max_trajectory: record the canvas after each of the first `max_trajectory` steps.
    """

    gen_length: int
    block_length: int
    steps: int
    policy: policies_lib.Policy
    cache: caches_lib.Cache
    temperature: float
    cfg_scale: float
    stop_at_eos: bool | Literal["block"]
    prompt_bucket: int
    max_trajectory: int

    def __init__(self, *, policy: str | policies_lib.Policy = "llada", cache: str | caches_lib.Cache = "none",
                 **settings: Any):
        setting_owners()  # no keyword has two kinds of owner (a policy or cache registered with a clash)
        loop = {k: settings.pop(k) for k in list(settings) if k in _LOOP_DEFAULTS}
        if isinstance(policy, str):
            policy = policies_lib.policy_class(policy)()
        if isinstance(cache, str):
            cache = caches_lib.cache_class(cache)()
        policy, settings = _route(settings, policy, "policy")
        cache, settings = _route(settings, cache, "cache")
        if settings:
            raise ConfigError(_unused_message(settings, policy, cache))
        for name, default in _LOOP_DEFAULTS.items():
            object.__setattr__(self, name, loop.get(name, default))
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "cache", cache)
        self._validate()

    def _validate(self) -> None:
        check_fields(self)
        for name in ("gen_length", "block_length", "steps", "prompt_bucket"):
            require_positive_int(getattr(self, name), name)
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ConfigError("temperature and cfg_scale must be >= 0")
        if not isinstance(self.max_trajectory, int) or self.max_trajectory < 0:
            raise ConfigError("max_trajectory must be an integer >= 0")
        canvas = self.canvas  # the canvas checks its policy and its own layout rules
        canvas.check_policy(self.policy)
        if not canvas.diffusion_blocks and self.block_length != _LOOP_DEFAULTS["block_length"]:
            hint = (f"set its draft window with window={self.block_length}" if "window" in type(self.policy).settings()
                    else "drop block_length")
            raise ConfigError(f"block_length is the diffusion block; policy {self.policy.name!r} decodes without "
                              f"blocks: {hint}")
        canvas.check_config(self)
        self.policy.check(self)
        self.cache.check(self)

    # -- derived -------------------------------------------------------------------------------
    @property
    def canvas(self):
        """The `Canvas` the policy decodes on (`jaxdllm.decoding.canvases`)."""
        from jaxdllm.decoding.canvases import canvas_of

        return canvas_of(self)

    @property
    def num_blocks(self) -> int:
        """Blocks of `block_length` that hold `gen_length` tokens (a block-causal model decodes any
        `gen_length`, to the end of a block)."""
        return -(-self.gen_length // self.block_length)

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    def __getattr__(self, name: str):
        """A policy or cache setting by its flat name (`config.threshold`)."""
        if name.startswith("__") or name in ("policy", "cache"):  # not set yet (during __init__)
            raise AttributeError(name)
        for owner, prefix in ((self.policy, ""), (self.cache, ""), (self.cache, _CACHE_PREFIX)):
            if name.startswith(prefix) and name[len(prefix):] in type(owner).settings():
                return getattr(owner, name[len(prefix):])
        raise AttributeError(f"SamplerConfig has no setting {name!r} for policy {self.policy.name!r} "
                             f"and cache {self.cache.name!r}")

    def replace(self, **changes: Any) -> "SamplerConfig":
        """A copy with `changes` (loop settings, `policy`/`cache`, or their settings by flat name)."""
        return dataclasses.replace(self, **changes)

    def resized(self, gen_length: int, **changes: Any) -> "SamplerConfig":
        """A copy for a canvas of `gen_length` tokens: `block_length`, `steps` and the policy's
        resized settings (Jacobi's `window`) rescaled by the rule of `preset` (unless given in
        `changes`), then `changes` applied.

            SamplerConfig.preset("llada").resized(64)    # 2 blocks of 32, 64 steps
        """
        return self.replace(**_rescaled(self, {"gen_length": gen_length, **changes}))

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """Every keyword the constructor may take (loop settings, every policy's and cache's settings)."""
        names = set(_LOOP_DEFAULTS) | {"policy", "cache"}
        for p in policies_lib.POLICIES.values():
            names |= set(p.settings())
        for c in caches_lib.CACHES.values():
            names |= {_CACHE_PREFIX + s for s in c.settings()} | set(c.settings())
        return tuple(sorted(names))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "SamplerConfig":
        """A published setting by name (see `SAMPLER_PRESETS`), with overrides.

        The presets carry the papers' lengths (mostly 256 generated tokens). A different
        `gen_length` G rescales what depends on it, unless passed too:

        - `block_length`: a preset whose block is the whole canvas (`dream`) keeps one block (G);
          the other diffusion presets take the largest divisor of G that is at most the published
          block (32: G = 16 gives one block of 16, G = 48 two blocks of 24).
        - the policy's own settings (`Policy.resized_settings`): Jacobi's draft `window` stays the
          published n, at most G.
        - `steps`: the published steps per generated token (1 for the scheduled policies, one
          token per step), rounded up to a multiple of the number of blocks.

            SamplerConfig.preset("llada", gen_length=16)   # block_length 16, steps 16

        A combination that still cannot work raises `ConfigError` naming the setting to pass.
        """
        if name not in SAMPLER_PRESETS:
            raise ConfigError(f"unknown sampler preset {name!r}; known presets: {sorted(SAMPLER_PRESETS)}")
        base = SAMPLER_PRESETS[name]
        return base.replace(**_rescaled(base, overrides))


def _rescaled(base: SamplerConfig, overrides: dict) -> dict:
    """`overrides` plus the `block_length`, `steps` and policy settings that a new `gen_length`
    implies (see `preset`)."""
    gen = overrides.get("gen_length", base.gen_length)
    if gen == base.gen_length or not isinstance(gen, int) or isinstance(gen, bool) or gen < 1:
        return overrides  # nothing to rescale (a bad value is reported by the constructor)
    from jaxdllm.decoding.canvases import canvas_of

    out = dict(overrides)
    policy = out.get("policy", base.policy)
    if "block_length" not in out:
        canvas = canvas_of(policies_lib.policy_class(policy) if isinstance(policy, str) else policy)
        out["block_length"] = canvas.resized_block_length(base.block_length, base.gen_length, gen)
    if "policy" not in out:  # the preset's policy: its own settings follow the canvas (a window at most G)
        for name, value in base.policy.resized_settings(base.gen_length, gen).items():
            out.setdefault(name, value)
    block = out["block_length"]
    if "steps" not in out and isinstance(block, int) and block > 0:
        blocks = -(-gen // block)  # whole blocks (block-causal models decode any G to the end of a block)
        width = blocks * block
        per_token = -(-base.steps * width // base.gen_length)  # ceil(width * published steps / published G)
        out["steps"] = min(-(-per_token // blocks) * blocks, width)
    return out


def settings_for_preset(preset: str, settings: dict) -> dict:
    """`settings` less what `preset` does not take: the policy settings of another policy and, on a
    canvas without diffusion blocks, `block_length`. A checkpoint's sampler file names its default
    sampler's settings (a causal model's Jacobi `window`, a diffusion model's block); decoding it with
    another preset (`lookahead`, `medusa`; `specdiff` on a diffusion model, which then says why it
    cannot) leaves them out. The other loop settings and the cache's stay."""
    if preset not in SAMPLER_PRESETS:
        return settings  # the unknown name is reported where the preset is built
    owners = setting_owners()
    base = SAMPLER_PRESETS[preset]
    takes = set(type(base.policy).settings())
    if base.canvas.diffusion_blocks:
        takes.add("block_length")
    return {k: v for k, v in settings.items()
            if k in takes or (owners.get(k, ("",))[0] != "policy" and k != "block_length")}


def _unused_message(settings: dict, policy, cache) -> str:
    parts = []
    for key in sorted(settings):
        kind, owners = _owners_of(key)
        if owners:
            chosen = policy if kind == "policy" else cache
            parts.append(f"{key!r} is a setting of {kind} {' / '.join(repr(o) for o in owners)}, not of "
                         f"{chosen.name!r}: choose that {kind} ({kind}=...) or drop the setting")
        else:
            parts.append(f"unknown sampler setting {key!r}")
    options = sorted(set(_LOOP_DEFAULTS) | set(type(policy).settings()) | set(type(cache).settings()))
    return "; ".join(parts) + f" (settings for policy {policy.name!r} and cache {cache.name!r}: {options})"


SAMPLER_PRESETS: dict[str, SamplerConfig] = {
    # LLaDA-8B-Instruct GSM8K baseline: one token per step.
    "llada": SamplerConfig(gen_length=256, block_length=32, steps=256),
    "llada-random": SamplerConfig(gen_length=256, block_length=32, steps=256, remasking="random"),
    # Fast-dLLM (LLaDA, GSM8K): parallel threshold 0.9, with and without caches.
    "fast-dllm-parallel": SamplerConfig(gen_length=256, block_length=32, policy="threshold", threshold=0.9),
    "fast-dllm-prefix": SamplerConfig(gen_length=256, block_length=32, policy="threshold", cache="prefix"),
    "fast-dllm-dual": SamplerConfig(gen_length=256, block_length=32, policy="threshold", cache="dual"),
    "fast-dllm-factor": SamplerConfig(gen_length=256, block_length=32, policy="factor", factor=1.0),
    # dParallel evaluation sampler: entropy threshold 0.5, no cache.
    "dparallel": SamplerConfig(gen_length=256, block_length=32, policy="entropy", entropy_threshold=0.5),
    "dparallel-mbpp": SamplerConfig(gen_length=256, block_length=32, policy="entropy", entropy_threshold=0.45),
    # EB-sampler (entropy-bounded unmasking) on LLaDA-style blocks: the lowest-entropy candidates while
    # their entropies, each one's own left out, sum to <= 0.1 nats (the paper's and DiffusionGemma's bound).
    "eb": SamplerConfig(gen_length=256, block_length=32, policy="entropy_bound", entropy_bound=0.1),
    "prophet": SamplerConfig(gen_length=256, block_length=32, steps=256, policy="prophet"),
    "credit": SamplerConfig(gen_length=256, block_length=32, policy="credit"),
    # Learn2PD (LLaDA, GSM8K): LLaDA's one-token-per-step schedule plus every position its trained
    # filter accepts (sigmoid > 0.96), with end-of-text prediction. The filter is found beside the
    # model (`learn2pd_filter.safetensors`, `jaxdllm distill learn2pd`).
    "learn2pd": SamplerConfig(gen_length=256, block_length=32, steps=256, policy="learn2pd",
                              filter_threshold=0.96, eot_prediction=True),
    "local-leap": SamplerConfig(gen_length=256, block_length=32, policy="local_leap"),
    # FreeDave (LLaDA): the `llada` preset's output (one token per step, blocks of 32), drafts of the next
    # 4 steps verified per forward (the published LLaDA setting), exact match.
    "freedave": SamplerConfig(gen_length=256, block_length=32, steps=256, policy="freedave", drafts=4),
    # Dream-v0-Instruct-7B's published generation settings (GSM8K-style): 256 tokens, 256 steps,
    # entropy ordering, greedy tokens.
    "dream": SamplerConfig(gen_length=256, block_length=256, steps=256, policy="dream", dream_alg="entropy"),
    # LLaDA2.0 (MoE block diffusion) generate(): blocks of 32 with 32 steps each, i.e. at least one
    # token per step plus every masked position whose top-1 probability clears 0.95; greedy;
    # decoding starts in the block holding the prompt's end and a row stops after the block that
    # holds its EOS, as the published loop (jaxdllm/models/families/llada2.py lists what differs).
    "llada2": SamplerConfig(gen_length=256, block_length=32, policy="threshold", threshold=0.95,
                            stop_at_eos="block"),
    # LLaDA2.1: the same mask commits plus token editing (committed tokens re-decided above 0.9, a
    # block held open for up to 16 mask-free steps while edits continue).
    "llada2.1": SamplerConfig(gen_length=256, block_length=32, policy="token_editing", threshold=0.95,
                              editing_threshold=0.9, max_post_steps=16, stop_at_eos="block"),
    # SDAR (JetAstra/SDAR, JetLM/SDAR-*-Chat): blocks of 4 at absolute positions from position 0, the
    # prompt's whole blocks prefilled block-causally, each block denoised in at most 4 steps over the
    # cached blocks (each step one forward of the block's 4 tokens), then its K/V stored (the block
    # cache's rewrite, not in nfe); greedy, as SDAR-8B-Chat's reported results; a row stops after the
    # block that holds its EOS. `sdar`: low_confidence_dynamic, every masked position above 0.9 if
    # any, else the most confident one (JetEngine's README and LMDeploy: 0.9; generate.py's default
    # is 0.85). `sdar-static`: low_confidence_static, the most confident one per step (4 steps per
    # block). `sdar-eb`: JetEngine's entropy_bounded, the lowest-entropy positions while their summed
    # entropy stays below 0.35 nats, at least one (generate.py's branch of that name does not run).
    "sdar": SamplerConfig(gen_length=256, block_length=4, steps=256, policy="threshold", threshold=0.9,
                          cache="block", stop_at_eos="block"),
    "sdar-static": SamplerConfig(gen_length=256, block_length=4, steps=256, policy="llada", cache="block",
                                 stop_at_eos="block"),
    "sdar-eb": SamplerConfig(gen_length=256, block_length=4, steps=256, policy="entropy_bound", entropy_bound=0.35,
                             entropy_bound_rule="cumsum", cache="block", stop_at_eos="block"),
    # DiffusionGemma's generate(): canvases of 256 uniformly random tokens, at most 48 denoising steps
    # each, the entropy bound 0.1, temperature 0.8 -> 0.4, stop when stable for a step and the mean
    # entropy < 0.005; rows end at a canvas holding a stop id (the model's EOS / end of turn, or the
    # checkpoint's generation config's list).
    "diffusiongemma": SamplerConfig(gen_length=256, block_length=256, policy="diffusiongemma"),
    # Jacobi decoding of a causal model (greedy; the published window of 16 draft tokens).
    "jacobi": SamplerConfig(gen_length=256, window=16, policy="jacobi", stop_at_eos=True),
    # Jacobi Forcing's decoding of its distilled models: blocks of 64 (the window n), multi-block (2 in
    # flight, the next one spawned at 85 % accepted) and rejection recycling (4 pool candidates per forward).
    "jacobi-forcing": SamplerConfig(gen_length=256, window=64, policy="jacobi", blocks=2, spawn_ratio=0.85,
                                    recycle=4, stop_at_eos=True),
    # Lookahead decoding's published setting for 7B models: 5-grams, a window of 7, 7 guesses.
    "lookahead": SamplerConfig(gen_length=256, policy="lookahead", level=5, window_size=7,
                               guess_set_size=7, stop_at_eos=True),
    # Medusa-1 heads found beside the model (medusa_heads.safetensors): the published 63-node tree of
    # 4 heads' top-10, greedy acceptance (exact); blockwise parallel decoding: the chain of their top-1.
    "medusa": SamplerConfig(gen_length=256, policy="medusa", stop_at_eos=True),
    "bpd": SamplerConfig(gen_length=256, policy="bpd", stop_at_eos=True),
    # Token Recycling: the published 80-node tree drafted from each row's table of every token's last top-8.
    "token-recycling": SamplerConfig(gen_length=256, policy="token_recycling", stop_at_eos=True),
    # A masked-diffusion drafter (the model's companions.json names it) drafts 8 tokens, 4 per drafter
    # forward, left to right, with the adaptive draft length; the causal model verifies them in one
    # forward: greedy (its greedy output) or, at temperature > 0, speculative sampling (its distribution).
    "specdiff": SamplerConfig(gen_length=256, policy="spec_diffusion", gamma=8, tokens_per_step=4, stop_at_eos=True),
    # DiffuSpec's lattice drafts: one drafter forward, 4 beams over each position's top tokens (mass 0.9,
    # at most 4), verified as sibling chains (greedy).
    "diffuspec": SamplerConfig(gen_length=256, policy="spec_diffusion", gamma=8, tokens_per_step=8, beams=4,
                               stop_at_eos=True),
    # APD: a diffusion model's left-to-right drafts of up to 16 tokens, committed while they match the
    # mixture with a small causal model (companions.json names it) at R = 0.7.
    "apd": SamplerConfig(gen_length=256, policy="apd", mix=0.7, kv_window=16, draft_window=16, stop_at_eos=True),
    # Set Block Decoding: a causal model trained with `set_block` decodes blocks of 16 MASK with the
    # EB-sampler (greedy), the previous block re-encoded causally inside each block's first forward;
    # gamma 0.1 and 0.35 are the paper's gamma_low / gamma_high for reasoning.
    "sbd": SamplerConfig(gen_length=256, block_length=16, policy="entropy_bound", entropy_bound=0.1,
                         cache="set_block", stop_at_eos=True),
    "sbd-high": SamplerConfig(gen_length=256, block_length=16, policy="entropy_bound", entropy_bound=0.35,
                              cache="set_block", stop_at_eos=True),
    # WeDLM's streaming decoding of a causal model trained with `wedlm`: a window of 16 masks after the
    # committed prefix, decided tokens reordered first; every mask whose entropy plus 0.02 per slot of
    # distance is below 0.4, else the lowest (the engine's defaults and evaluation script); greedy.
    # `wedlm-quality`: the paper's quality tables, one mask per step, lambda 0.1, a window of 6, T 0.1.
    "wedlm": SamplerConfig(gen_length=256, policy="wedlm", window=16, entropy_threshold=0.4, pos_penalty=0.02,
                           stop_at_eos=True),
    "wedlm-quality": SamplerConfig(gen_length=256, policy="wedlm", window=6, entropy_threshold=0.0, pos_penalty=0.1,
                                   temperature=0.1, stop_at_eos=True),
    # ASSD (any-subset speculative decoding) of an any-order model (XLNet): the next k = 5 ranks drafted in one
    # forward and verified in a second, T = 1 (the published main runs): the model's sequential sampling under
    # the order (visible tokens, then the MASK positions left to right). `assd-greedy`: T = 0, drafts kept
    # while they are the verifier's argmax: sequential greedy decoding under the order, token for token.
    "assd": SamplerConfig(gen_length=256, policy="assd", drafts=5, temperature=1.0, stop_at_eos=True),
    "assd-greedy": SamplerConfig(gen_length=256, policy="assd", drafts=5, temperature=0.0, stop_at_eos=True),
    # Multiverse: a model that writes <Parallel> blocks forks at </Goal> into one row per outline (up to 4 at
    # once) and merges at the last </Path>, over shared K/V pages; the published engine's prefixes
    # ("\n<Path>\n{k}:", "<Conclusion>\n") and its example's temperature 0.6 (top_p 0.95 is not applied). The
    # ids come from the checkpoint's tokenizer (`sampler_defaults`).
    "multiverse": SamplerConfig(gen_length=256, policy="multiverse", max_paths=4, newlines=True, temperature=0.6,
                                stop_at_eos=True),
    # Hogwild! Inference: two workers share one cache, each seeing the other's newest tokens; a step ends at a
    # blank line after a sentence and joins the common history; the redundancy check every 256 tokens; EOS
    # ends the problem, else the greedy 16-token finisher. Greedy (the published loop samples where the model's
    # generation config does). The texts come from the checkpoint's tokenizer (`sampler_defaults`).
    "hogwild": SamplerConfig(gen_length=256, policy="hogwild", workers=2, check_every=256, finisher_tokens=16),
    # GenMol (V1 hparams; jaxdllm/decoding/genmol_canvas.py): the MASK tokens of a given canvas
    # (`genmol_canvas`), one per step and row by sampled confidence plus Gumbel noise of scale r annealed
    # to 0, tempered softmax T; molecular context guidance (gamma of the context masked, w = 2) on the
    # fragment tasks. gen_length 1: the canvas is given (a plain prompt gets gen_length MASK after it).
    "genmol": SamplerConfig(gen_length=1, policy="genmol", temperature=0.5, randomness=0.5),
    "genmol-denovo": SamplerConfig(gen_length=1, policy="genmol", temperature=0.5, randomness=0.5),
    "genmol-linker": SamplerConfig(gen_length=1, policy="genmol", temperature=1.2, randomness=3.0),
    "genmol-motif": SamplerConfig(gen_length=1, policy="genmol", temperature=1.2, randomness=1.2, guidance_gamma=0.3),
    "genmol-scaffold": SamplerConfig(gen_length=1, policy="genmol", temperature=1.2, randomness=2.0,
                                     guidance_gamma=0.3),
    "genmol-superstructure": SamplerConfig(gen_length=1, policy="genmol", temperature=1.2, randomness=2.0,
                                           guidance_gamma=0.4),
    "genmol-remask": SamplerConfig(gen_length=1, policy="genmol", temperature=1.2, randomness=2.0),
}

# One line per preset: what it decodes with (`jaxdllm generate --help` lists them; a test checks that
# every preset has one).
SAMPLER_PRESET_SUMMARIES: dict[str, str] = {
    "llada": "LLaDA: one token per step, lowest confidence remasked, blocks of 32",
    "llada-random": "LLaDA with random remasking: one random position per step",
    "fast-dllm-parallel": "Fast-dLLM: every position above confidence 0.9 per step, no cache",
    "fast-dllm-prefix": "Fast-dLLM threshold 0.9 with the prefix KV cache (approximate)",
    "fast-dllm-dual": "Fast-dLLM threshold 0.9 with the dual (prefix and suffix) KV cache (approximate)",
    "fast-dllm-factor": "Fast-dLLM's factor rule: the longest run of confident positions, c_n >= 1 - 1/(n+1)",
    "dparallel": "dParallel: every position with entropy below 0.5 per step",
    "dparallel-mbpp": "dParallel's code setting: entropy below 0.45",
    "eb": "EB-sampler: the lowest-entropy positions while their summed entropy stays <= 0.1",
    "prophet": "Prophet: one token per step, the rest filled at once when the top-1/top-2 gap is large",
    "credit": "CreditDecoding: per-token credit accumulated over steps, fused into the logits",
    "learn2pd": "Learn2PD: one token per step plus every position its trained filter accepts",
    "local-leap": "LocalLeap: confident anchors lower the bar for their neighbours",
    "freedave": "FreeDave: llada's tokens in fewer forwards (4 steps' drafts verified per forward)",
    "dream": "Dream: the whole answer as one block, entropy order, 256 steps",
    "llada2": "LLaDA2.0: block-causal blocks of 32, threshold 0.95, stop after the EOS's block",
    "llada2.1": "LLaDA2.1: llada2 plus token editing of committed tokens above 0.9",
    "sdar": "SDAR: blocks of 4 over a block cache, every position above 0.9 else the top one (generate.py: 0.85)",
    "sdar-static": "SDAR's low_confidence_static: blocks of 4, the most confident position per step",
    "sdar-eb": "SDAR with JetEngine's entropy bound: lowest entropies while their sum stays below 0.35",
    "diffusiongemma": "DiffusionGemma: uniform-noise canvases, entropy bound 0.1, up to 48 steps each",
    "jacobi": "Jacobi decoding of a causal model: windows of 16 draft tokens, greedy (exact)",
    "jacobi-forcing": "Jacobi Forcing: blocks of 64, two in flight, rejection recycling",
    "lookahead": "Lookahead decoding of a causal model: 5-grams, window 7, 7 guesses (exact)",
    "medusa": "Medusa-1 heads beside the model: a 63-node tree, greedy acceptance (exact)",
    "bpd": "Blockwise parallel decoding: the chain of the heads' top-1 (exact)",
    "token-recycling": "Token Recycling: an 80-node tree from each row's table of top-8 tokens (exact)",
    "specdiff": "SpecDiff: a diffusion drafter (companions.json) drafts 8 tokens for a causal model",
    "diffuspec": "DiffuSpec: a diffusion drafter's lattice of 4 beams, verified by a causal model",
    "apd": "APD: a diffusion model's drafts kept while they match its mix with a small causal model",
    "sbd": "Set Block Decoding: blocks of 16 MASK after a causal model's text, EB-sampler gamma 0.1 (exact prefix)",
    "sbd-high": "Set Block Decoding with the paper's higher bound, gamma 0.35: fewer forwards",
    "wedlm": "WeDLM: a streaming window of 16 masks over a prefix cache, entropy + 0.02/slot below 0.4",
    "wedlm-quality": "WeDLM's quality setting: one mask per step, window 6, distance penalty 0.1, T 0.1",
    "assd": "ASSD: an any-order model (XLNet) drafts 5 ranks, verifies them; its sequential sampling, T 1 (exact)",
    "assd-greedy": "ASSD at T 0: drafts kept while they are the verifier's argmax: sequential greedy (exact)",
    "multiverse": "Multiverse: fork at </Goal> into one row per outline over shared K/V pages, merge at </Path>, T 0.6",
    "hogwild": "Hogwild!: 2 workers over one shared cache, steps joining a common history, the finisher at the end",
    "genmol": "GenMol de novo: a given canvas's MASKs one per step by sampled confidence + Gumbel noise, T 0.5, r 0.5",
    "genmol-denovo": "GenMol de novo (the same as genmol): T 0.5, r 0.5, no guidance",
    "genmol-linker": "GenMol linker design: T 1.2, r 3, no guidance",
    "genmol-motif": "GenMol motif extension: T 1.2, r 1.2, context guidance gamma 0.3 (w 2)",
    "genmol-scaffold": "GenMol scaffold decoration: T 1.2, r 2, context guidance gamma 0.3 (w 2)",
    "genmol-superstructure": "GenMol superstructure generation: T 1.2, r 2, context guidance gamma 0.4 (w 2)",
    "genmol-remask": "GenMol fragment remasking (PMO, lead optimization): T 1.2, r 2, no guidance",
}
