"""jaxdllm as an lm-evaluation-harness model (`pip install -e ".[eval]"`).

    jaxdllm-lm-eval run --model jaxdllm --model_args pretrained=/models/LLaDA-8B-Instruct,preset=dparallel \\
        --tasks jaxdllm_gsm8k --batch_size 16

lm-eval (0.4) finds models only in its own registry and has no plugin discovery, so the `lm_eval`
command cannot see a model another package defines. `jaxdllm-lm-eval` (`python -m
jaxdllm.eval.lm_eval_cli`) is lm-eval's own command line with `jaxdllm` registered and the
offline task configs of `lm_eval_tasks/` on the include path; from Python, import this module
and call `lm_eval.simple_evaluate(model="jaxdllm", ...)`.

- `generate_until`: requests in the order given, in batches of lm-eval's `--batch_size`, through
  `jaxdllm.generate` with the preset (plus the checkpoint's `jaxdllm_sampler.json` and any
  sampler option in `model_args`, e.g. `threshold=0.7`); each response is cut at the request's
  `until` strings. After each call a line on stderr gives the mean NFE, answer tokens per
  forward and tokens/s.
- `loglikelihood`: causal models exactly (one forward). Diffusion models by LLaDA's Monte-Carlo
  estimate: `mc_num` samples, each masking `l` of the continuation's L tokens (`l` stratified
  over 1..L), summing `-log p` of the masked tokens times `L / l`; `is_greedy` decodes the
  continuation with the `llada` sampler one token per step and compares. Block-causal models
  and `loglikelihood_rolling` raise `NotImplementedError`.
"""

from __future__ import annotations

import functools
import sys

from jaxdllm.extras import require

require("lm_eval", "eval", "jaxdllm's lm-evaluation-harness model (jaxdllm.eval.harness)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from jaxdllm.checkpoint.folder import Checkpoint  # noqa: E402
from jaxdllm.checkpoint.hf_io import from_pretrained  # noqa: E402
from jaxdllm.models.families import family_of  # noqa: E402
from jaxdllm.decoding import SamplerConfig, generate  # noqa: E402
from jaxdllm.errors import ConfigError  # noqa: E402
from jaxdllm.eval.runner import decode_rows  # noqa: E402
from jaxdllm.models.transformer import align_logits  # noqa: E402
from jaxdllm.pretrained import sampler_defaults  # noqa: E402
from jaxdllm.tokenizer import Tokenizer  # noqa: E402

_LM_EVAL_KEYS = {"device", "max_batch_size"}  # lm-eval passes these to every model


@functools.partial(nnx.jit, static_argnames="align")
def _float_logits(model, ids: jax.Array, align: bool) -> jax.Array:
    """`[B, L, V]` float32 logits of `ids [B, L]`; with `align`, `out[:, i]` predicts token i
    (`align_logits`). Compiled once per shape: an eager forward dispatches op by op."""
    logits = model(ids).logits
    return (align_logits(logits, model.config) if align else logits).astype(jnp.float32)


def cut_at_stops(text: str, until) -> str:
    """`text` up to the earliest of the stop strings `until` (a string or a list)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((text.find(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]


@register_model("jaxdllm")
class JaxdllmLM(LM):
    """An lm-eval `LM` over a local checkpoint decoded with jaxdllm's compiled sampler.

    Args (lm-eval `--model_args`):
      pretrained: checkpoint directory (or shipped name, or `Checkpoint`).
      preset: sampler preset (`SamplerConfig.preset`; default: the checkpoint's own settings,
        `jaxdllm.sampler_defaults`); other keys that are sampler options
        (`threshold`, `gen_length`, ...) override it.
      batch_size: prompts per `generate` call (lm-eval's `--batch_size`).
      dtype: parameter dtype to load.
      mc_num, mc_batch: Monte-Carlo samples per loglikelihood request, and per forward.
      seed: the Monte-Carlo masks' seed.
    """

    def __init__(self, pretrained: str, preset: str | None = None, batch_size: int | str = 8, dtype: str = "float32",
                 mc_num: int = 128, mc_batch: int = 32, seed: int = 0, **options):
        super().__init__()
        sampler = {k: v for k, v in options.items() if k not in _LM_EVAL_KEYS}
        unknown = sorted(set(sampler) - set(SamplerConfig.option_names()))
        if unknown:
            raise ConfigError(f"unknown jaxdllm model_args {unknown}: give pretrained, preset, batch_size, dtype, "
                              f"mc_num, mc_batch, seed, or sampler options {list(SamplerConfig.option_names())}")
        checkpoint = Checkpoint.open(pretrained)  # found and its config.json parsed once, for the three loaders
        self.sampler_config = sampler_defaults(checkpoint, preset, **sampler)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 8
        self.model = from_pretrained(checkpoint, dtype=dtype)
        self.tokenizer = Tokenizer.from_pretrained(checkpoint)
        self.pretrained = str(pretrained)
        self.mc_num, self.mc_batch, self.seed = int(mc_num), int(mc_batch), int(seed)
        if self.mc_num % self.mc_batch:
            raise ConfigError(f"mc_num ({self.mc_num}) must be a multiple of mc_batch ({self.mc_batch})")
        self._chat = False
        self.stats: dict = {}

    # -- chat -------------------------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.rstrip("/").replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat template's text; the BOS it contains is not added a second time when encoding."""
        self._chat = True
        return self.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=not self._chat)

    # -- generation -------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode each request's context; cut at its `until` strings. `[len(requests)]` texts."""
        out, nfe, answer, seconds = [], 0, 0, 0.0
        bar = tqdm(total=len(requests), desc="jaxdllm generate_until", disable=disable_tqdm)
        for lo in range(0, len(requests), self.batch_size):
            chunk = requests[lo:lo + self.batch_size]
            config = self.sampler_config
            kwargs = chunk[0].args[1] if len(chunk[0].args) > 1 else {}
            # a temperature request changes samplers that take one; one with its own temperature
            # schedule refuses it and keeps its schedule
            if kwargs.get("do_sample") and kwargs.get("temperature", 0) > 0:
                try:
                    config = config.replace(temperature=float(kwargs["temperature"]))
                except ConfigError:
                    pass
            texts, row_nfe, row_answer, batch_seconds, _ = decode_rows(
                self.model, self.tokenizer, [self._encode(r.args[0]) for r in chunk], config)
            for request, text in zip(chunk, texts):
                until = (request.args[1] if len(request.args) > 1 else {}).get("until")
                out.append(cut_at_stops(text, until))
            nfe += int(np.sum(row_nfe))
            answer += int(np.sum(row_answer))
            seconds += batch_seconds
            bar.update(len(chunk))
        bar.close()
        self.stats = {"requests": len(requests), "mean_nfe": nfe / max(len(requests), 1),
                      "answer_tokens_per_forward": answer / max(nfe, 1), "tokens_per_s": answer / max(seconds, 1e-9)}
        print(f"jaxdllm: {len(requests)} requests, mean NFE {self.stats['mean_nfe']:.2f}, answer tokens/forward "
              f"{self.stats['answer_tokens_per_forward']:.2f}, {self.stats['tokens_per_s']:.1f} tokens/s "
              "(compile included)", file=sys.stderr)
        return out

    # -- likelihood -------------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """`(log p(continuation | context), greedy decoding reproduces it)` per request."""
        attention = self.model.config.attention
        if attention == "block_causal":
            raise NotImplementedError("jaxdllm: loglikelihood of block-causal models is not supported; "
                                      "use generation tasks")
        family = family_of(self.model.config)
        if not family.scores_likelihood:
            raise NotImplementedError(f"jaxdllm: loglikelihood of {family.name} models is not supported; use "
                                      "generation tasks")
        out = []
        for i, request in enumerate(tqdm(requests, desc="jaxdllm loglikelihood", disable=disable_tqdm)):
            context, continuation = request.args
            ctx = self._encode(context)
            cont = self.tokenizer.encode(continuation, add_special_tokens=False)
            if not cont:
                raise ConfigError(f"loglikelihood request {i} has an empty continuation")
            if attention == "causal":
                out.append(self._causal_loglikelihood(ctx, cont))
            else:
                key = jax.random.fold_in(jax.random.PRNGKey(self.seed), i)
                out.append((self.masked_loglikelihood(ctx, cont, key), self._greedy_matches(ctx, cont)))
        return out

    def _causal_loglikelihood(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        ids = jnp.asarray([ctx + cont], jnp.int32)
        logp = jax.nn.log_softmax(_float_logits(self.model, ids, align=False)[0, len(ctx) - 1:-1], axis=-1)
        target = jnp.asarray(cont)
        return float(logp[jnp.arange(len(cont)), target].sum()), bool((logp.argmax(-1) == target).all())

    def masked_loglikelihood(self, ctx: list[int], cont: list[int], key: jax.Array) -> float:
        """LLaDA's Monte-Carlo estimate of `log p(cont | ctx)` for a masked diffusion model (a lower
        bound in expectation): `-mean_s sum_{masked i} -log p(cont_i | masked sequence) * L / l_s`."""
        length = len(cont)
        seq = np.asarray(ctx + cont, np.int32)
        mask_id = self.model.config.mask_token_id
        total = 0.0
        for start in range(0, self.mc_num, self.mc_batch):
            key, k_count, k_perm = jax.random.split(key, 3)
            # Stratified counts l in 1..L: one random offset, then evenly spaced over the batch.
            first = int(jax.random.randint(k_count, (), 1, length + 1))
            counts = (np.round(np.linspace(first, first + (self.mc_batch - 1) * length / self.mc_batch,
                                           self.mc_batch)).astype(int) - 1) % length + 1
            order = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, length))(
                jax.random.split(k_perm, self.mc_batch)))
            masked = np.zeros((self.mc_batch, len(seq)), bool)
            masked[:, len(ctx):] = order < counts[:, None]
            ids = np.where(masked, mask_id, seq[None])
            logp = jax.nn.log_softmax(_float_logits(self.model, jnp.asarray(ids), align=True), axis=-1)
            token_logp = np.asarray(jnp.take_along_axis(logp, jnp.asarray(seq)[None, :, None], -1)[..., 0])
            total += float((np.where(masked, token_logp, 0.0).sum(1) * length / counts).sum())
        return total / self.mc_num

    def _greedy_matches(self, ctx: list[int], cont: list[int]) -> bool:
        n = len(cont)
        config = SamplerConfig.preset("llada", gen_length=n, block_length=n, steps=n)
        result = generate(self.model, np.asarray([ctx], np.int32), config)
        return bool((np.asarray(result.tokens[0, len(ctx):]) == np.asarray(cont)).all())

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("jaxdllm: loglikelihood_rolling (perplexity tasks) is not supported")
