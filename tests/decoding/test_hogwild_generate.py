"""Hogwild! decoding in the one loop against an uncached reference of the published procedure.

The reference (written here from `assd-hogwild-multiverse.md` §2c) recomputes each worker's view as
contiguous text with transformers' model every step: [common, others header, the other workers' steps
(with what they feed this step), own header, own step]; the step-end rule on decoded text; a finished
step appended to common; the next header (+ the redundancy check); EOS or the budget, then the finisher.
On a one-layer model a cached view equals the contiguous forward exactly (no deeper-layer K/V to go
stale), so the tokens, the step ends and the forward count must be identical. A chooser bias forces a
few sentence ends and blank lines so steps end; every other token is the model's argmax.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm.data.char_tokenizer import BOS_ID, EOS_ID, build_char_tokenizer
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.decoding.policies.hogwild import Hogwild
from support.hf_models import make_hf_model
from support.optional import torch

TOK = build_char_tokenizer()
NAMES = ("Al", "Bo", "Cy")  # short texts: the views stay inside the model's 256 positions
SENTENCE_END = tuple(". ? ! 。 ۔ ؟ । ॥ … ‽ ། ᠃ ։ ჻ ¶ ❧".split())
FINISHER = "<...>\n\nAnswer: \\boxed{"
CHECK = "Check: redundant? "


def enc(text: str) -> tuple[int, ...]:
    return tuple(TOK.encode(text, add_special_tokens=False))


def id_of(ch: str) -> int:
    return enc(ch)[0]


# forced tokens: (worker, loop step) -> token; each worker ends two steps (".", "\n", "\n")
FORCED = {(0, 2): id_of("."), (0, 3): id_of("\n"), (0, 4): id_of("\n"),
          (1, 5): id_of("!"), (1, 6): id_of("\n"), (1, 7): id_of("\n"),
          (0, 9): id_of("?"), (0, 10): id_of("\n"), (0, 11): id_of("\n"),
          (2, 9): id_of("."), (2, 10): id_of("\n"), (2, 11): id_of("\n")}


SEEN: dict = {}  # (loop step, worker) -> the logits the canvas chose from (recorded by a host callback)


def _record(step, logits, live):
    for w in np.flatnonzero(np.asarray(live)):
        SEEN.setdefault((int(step), int(w)), np.asarray(logits[w]))


@dataclasses.dataclass(frozen=True)
class Forced(Hogwild):
    """The model's argmax, except the forced tokens; every row's logits are recorded."""

    def choose(self, logits, key, temperature, *, worker, step):
        jax.debug.callback(_record, step, logits, jnp.isfinite(logits).all(-1) & (temperature == 0))
        table = np.full((4, 64), -1, np.int32)
        for (w, s), token in FORCED.items():
            table[w, s] = token
        forced = jnp.asarray(table)[worker, jnp.clip(step, 0, 63)]
        return jnp.where(forced >= 0, forced, super().choose(logits, key, temperature, worker=worker, step=step))


def settings(workers: int, **changes) -> dict:
    newline = id_of("\n")
    base = dict(workers=workers,
                first_steps=tuple(enc(f"**{n} [1]:** Hi.") for n in NAMES[:workers]),
                header_prefixes=tuple(enc(f"**{n} [") for n in NAMES[:workers]), header_suffix=enc("]:** "),
                digit_ids=enc("0123456789"), others_header=enc("\n\n### Others\n\n"),
                own_header=enc("<...>\n\n### Own\n\n"), check_ids=enc(CHECK), check_every=12,
                finisher_ids=enc(FINISHER), finisher_tokens=4, newline_start_ids=(newline,),
                newline_end_ids=(newline,), newline_only_ids=(newline,),
                sentence_end_ids=tuple(i for i in (TOK.token_to_id(c) for c in SENTENCE_END) if i is not None),
                suppress_ids=(id_of("#"), BOS_ID))
    return {**base, **changes}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa", seed=7, num_hidden_layers=1, eos_token_id=EOS_ID, pad_token_id=0,
                       bos_token_id=BOS_ID)
    path = tmp_path_factory.mktemp("hogwild")
    hf.save_pretrained(path)
    return jaxdllm.from_pretrained(path), hf


def reference(hf, prompt: list[int], s: dict, gen_length: int):
    """`(answer tokens, forwards, logits by (step, worker))` of the published loop, every view recomputed as contiguous text."""
    n = s["workers"]
    chunk = Forced(**s).step_feed
    common, blocks = list(prompt), [[] for _ in range(n)]
    pending = [list(x) for x in s["first_steps"]]
    last, streams = [None] * n, [[] for _ in range(n)]
    step_no, since, written, forwards, seen = [1] * n, [0] * n, 0, 0, {}
    suppress = list(s["suppress_ids"])

    def argmax(tokens, w, step):
        with torch.no_grad():
            logits = hf(torch.tensor([tokens])).logits[0, -1].double()
        seen[(step, w)] = logits.numpy().copy()
        logits[suppress] = float("-inf")
        return FORCED.get((w, step), int(logits.argmax()))

    step = 0
    while True:
        fed = [pending[w] or [last[w]] for w in range(n)]
        for w in range(n):
            blocks[w] += fed[w]
            streams[w] += fed[w]
            since[w] += len(fed[w])
            written += len(fed[w])
            pending[w] = []
        sampled = []
        for w in range(n):
            view = (common + list(s["others_header"]) + sum((blocks[u] for u in range(n) if u != w), [])
                    + list(s["own_header"]) + blocks[w])
            sampled.append(argmax(view, w, step))
        forwards += 1
        if EOS_ID in sampled:
            return common[len(prompt):] + sum(blocks, []), forwards, seen
        for w in range(n):  # the published rule on the decoded text
            before = TOK.decode(streams[w])
            after = before + TOK.decode([sampled[w]])
            i = after.rfind("\n\n")
            ends = i >= 0 and i + 2 > len(before) and after[:i].endswith(SENTENCE_END)
            if ends:
                common += blocks[w]
                blocks[w] = []
                step_no[w] += 1
                pending[w] = [sampled[w]] + list(s["header_prefixes"][w]) + list(enc(str(step_no[w]))) + list(
                    s["header_suffix"])
                if since[w] > s["check_every"]:
                    pending[w] += list(s["check_ids"])
                    since[w] = 0
            last[w] = sampled[w]
        step += 1
        if written + n * chunk > gen_length - s["finisher_tokens"]:
            break
    flat = common + list(s["others_header"]) + sum(blocks, []) + list(s["finisher_ids"])
    answer = []
    while len(answer) < s["finisher_tokens"]:
        t = argmax(flat + answer, 0, step)
        forwards += 1
        step += 1
        answer.append(t)
        if t == EOS_ID:
            break
    return common[len(prompt):] + sum(blocks, []) + answer, forwards, seen


@pytest.mark.parametrize("workers,page_size", [(2, 16), (2, 5), (3, 3)])  # pages fill mid-feed, at step ends
def test_hogwild_equals_the_uncached_published_loop_on_a_one_layer_model(checkpoint, workers, page_size):
    model, hf = checkpoint
    s = settings(workers, page_size=page_size)
    gen_length = 224
    prompt = list(TOK.encode("Add 2 and 3.\n### Past steps\n\n"))
    expected, forwards, logits = reference(hf, prompt, s, gen_length)
    SEEN.clear()
    result = jaxdllm.generate(model, np.asarray([prompt]), SamplerConfig(gen_length=gen_length, policy=Forced(**s)))
    jax.effects_barrier()
    # every row's logits at every step (the finisher's: worker 0), against the contiguous forward's
    assert set(logits) <= set(SEEN) and len(logits) > 8 * workers
    for at, ref in logits.items():
        np.testing.assert_allclose(SEEN[at], ref, atol=2e-4, rtol=1e-4, err_msg=f"step, worker {at}")
    got = list(result.generated[0][:len(expected)])
    assert got == expected
    assert int(result.nfe[0]) == forwards
    text = TOK.decode(expected)
    assert "**Al [2]:** " in text and "**Bo [2]:** " in text  # steps ended and the next headers were fed
    assert (text.count("**Al [3]:** ") == 1) == (workers == 2)  # three workers spend the budget sooner
    assert CHECK in text                                                                  # the redundancy check
