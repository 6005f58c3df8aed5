"""Hogwild!'s texts and the step-end rule as id sets, against the published rule applied to decoded text."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxdllm.data.char_tokenizer import build_char_tokenizer
from jaxdllm.decoding.hogwild_text import SENTENCE_END, HogwildFormat, settings_for, step_end_sets
from jaxdllm.decoding.policies.hogwild import Hogwild
from jaxdllm.errors import ConfigError
from jaxdllm.tokenizer import Tokenizer

CORPUS = ["Done.\n\nNext we add.", "Why?\n\nBecause.", "x\n\n\ny", "We see!\nThen\n\nmore.", "a.\n\nb\n\nc.\n",
          "Alice [12]: ok.\n\n", "Bob [3]: 17 * 23 = 391.\n\n", "so 4\n\nthen. \n\n\n", "one, two\nthree.\n\n"] * 20


def bpe_tokenizer(split_digits: bool = True) -> Tokenizer:
    """A byte-level BPE trained here on a few lines with sentence ends and blank lines (no download); digits
    one token each, as Qwen's pre-tokenizer splits them (`split_digits=False`: "12" may become one token)."""
    backend = tokenizers.Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                             if split_digits else byte_level)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    return Tokenizer(backend, special_tokens={"bos_token": "<bos>", "eos_token": "<eos>"})


def published_rule(tokenizer, q: int, p: int, t: int) -> bool:
    """The step ends when the newest token completes "\\n\\n" and the text before that break ends a sentence."""
    before = tokenizer.decode([q, p], skip_special_tokens=False)
    after = tokenizer.decode([q, p, t], skip_special_tokens=False)
    i = after.rfind("\n\n")
    return i >= 0 and i + 2 > len(before) and after[:i].endswith(SENTENCE_END)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_step_end_sets_agree_with_the_published_rule_on_decoded_text(kind):
    tokenizer = build_char_tokenizer() if kind == "char" else bpe_tokenizer()
    sets = step_end_sets(tokenizer)
    policy = Hogwild(**sets)
    rng = np.random.default_rng(0)
    special = {tokenizer.token_to_id(t) for t in tokenizer.special_tokens.values()}
    ordinary = np.array([i for i in range(tokenizer.vocab_size) if i not in special])
    # half the draws from the tokens the rule is about, so every branch is met many times
    interesting = np.array(sorted(set(sets["newline_start_ids"] + sets["newline_end_ids"] + sets["sentence_end_ids"]
                                      + sets["break_ids"])))
    draw = lambda n: np.where(rng.random(n) < 0.5, rng.choice(interesting, n), rng.choice(ordinary, n))  # noqa: E731
    q, p, t = draw(4000), draw(4000), draw(4000)
    got = np.asarray(policy.step_ends(jnp.asarray(q), jnp.asarray(p), jnp.asarray(t)))
    want = np.array([published_rule(tokenizer, *x) for x in zip(q.tolist(), p.tolist(), t.tolist())])
    assert want.sum() > 20 and (~want).sum() > 20
    np.testing.assert_array_equal(got, want)


def test_hand_picked_step_ends_with_the_character_tokenizer():
    tok = build_char_tokenizer()
    policy = Hogwild(**step_end_sets(tok))
    one = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    cases = {"e.\n\n": True, "!\n\n": True, "x\n\n": False, "\n\n\n": False, ".\nx": False, "..\n": False}
    for text, ends in cases.items():
        q, p, t = one(text[0])[0], one(text[1])[0], one(text[2])[0]
        if len(text) == 4:
            q, p, t = one(text[1])[0], one(text[2])[0], one(text[3])[0]
        assert bool(policy.step_ends(jnp.asarray([q]), jnp.asarray([p]), jnp.asarray([t]))[0]) == ends, text


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_settings_hold_the_texts_and_a_header_composes_from_its_digits(kind):
    tokenizer = build_char_tokenizer() if kind == "char" else bpe_tokenizer()
    fmt = HogwildFormat(workers=3, check_every=40)
    s = settings_for(tokenizer, fmt)
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    assert [decode(x) for x in s["first_steps"]] == [fmt.first_step(w) for w in range(3)]
    for w, name in enumerate(("Alice", "Bob", "Carol")):
        for k in (1, 9, 10, 123):
            ids = s["header_prefixes"][w] + tuple(s["digit_ids"][int(c)] for c in str(k)) + s["header_suffix"]
            assert decode(ids) == f"**{name} [{k}]:** "
    assert decode(s["finisher_ids"]).endswith("\\boxed{") and decode(s["check_ids"]) == fmt.check_text
    assert s["check_every"] == 40 and tokenizer.token_to_id("<bos>") in s["suppress_ids"] or kind == "char"
    Hogwild(**s)  # a valid policy


def test_a_header_that_merges_with_its_number_is_refused():
    tokenizer = bpe_tokenizer(split_digits=False)  # its corpus has "[12]": "12" is one token
    with pytest.raises(ConfigError, match="prefix \\+ digits \\+ suffix"):
        settings_for(tokenizer, HogwildFormat())


def test_the_format_checks_its_settings_and_fills_the_template():
    with pytest.raises(ConfigError, match="workers must be 2, 3 or 4"):
        HogwildFormat(workers=5)
    with pytest.raises(ConfigError, match="must hold"):
        HogwildFormat(step_header="**{name}:** ")
    text = HogwildFormat(workers=2).prompt("What is 17 * 23?")
    assert text.startswith("# Collaborative Reasoning") and "Alice and Bob" in text
    assert text.endswith("Problem: What is 17 * 23?\n### Past steps\n\n")
