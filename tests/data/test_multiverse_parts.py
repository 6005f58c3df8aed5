"""Multiverse tags in the character tokenizer, the vocabulary resize, and the `parts` task's formats,
checker and curriculum."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxdllm.data import get_task
from jaxdllm.data.char_tokenizer import build_char_tokenizer
from jaxdllm.data.multiverse_tags import (PADDED_VOCAB_SIZE, TAG_IDS, TAGS, build_tag_tokenizer, save_tag_tokenizer,
                                          strip_tags, tag_ids_of)
from jaxdllm.data.parts_task import STAGES, PartsTask, curriculum
from jaxdllm.errors import ConfigError, DataError
from jaxdllm.tokenizer import Tokenizer

PUBLISHED = "<Think> </Think> <Parallel> </Parallel> <Goal> </Goal> <Outline> </Outline> <Path> </Path> <Conclusion> </Conclusion>"


def test_tags_are_one_token_each_at_ids_101_to_112_and_decode_back(tmp_path):
    assert TAGS == tuple(PUBLISHED.split())
    assert list(TAG_IDS.values()) == list(range(101, 113)) and PADDED_VOCAB_SIZE == 128
    tok = build_tag_tokenizer()
    text = "a<Parallel><Goal>b</Goal><Path>1:c</Path><Conclusion>d</Conclusion></Parallel>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[1] == 103 and ids.count(109) == 1 and len(ids) == 14
    assert tok.decode(ids) == text  # tags survive skip_special_tokens
    assert tok.decode([1, *ids, 2]) == text  # BOS / EOS still dropped
    save_tag_tokenizer(tmp_path, model_max_length=192)
    again = Tokenizer.from_pretrained(tmp_path)
    assert again.encode(text, add_special_tokens=False) == ids and tag_ids_of(again) == tuple(range(101, 113))
    plain = build_char_tokenizer()
    assert plain.encode("ab", add_special_tokens=False) == tok.encode("ab", add_special_tokens=False)
    with pytest.raises(DataError, match="build_tag_tokenizer"):
        tag_ids_of(plain)


def test_resize_puts_the_mean_of_the_tag_words_characters_in_each_tag_row():
    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.checkpoint.resize_vocab import add_multiverse_tags, resize_vocab

    model = from_pretrained("tasks-qwen2-small")
    grown = add_multiverse_tags(model, max_position=192)
    assert grown.config.vocab_size == 128 and grown.config.max_position == 192
    old_e, new_e = np.asarray(model.embed[...]), np.asarray(grown.embed[...])
    old_h, new_h = np.asarray(model.lm_head[...]), np.asarray(grown.lm_head[...])
    np.testing.assert_array_equal(new_e[:101], old_e)
    np.testing.assert_array_equal(new_h[:, :101], old_h)
    for tag in TAGS:
        word = tag.strip("</>")
        rows = [5 + ord(c) - 31 for c in word]  # newline is id 5, space (32) id 6: character c is 5 + ord(c) - 31
        assert build_char_tokenizer().encode(word, add_special_tokens=False) == rows
        np.testing.assert_allclose(new_e[TAG_IDS[tag]], old_e[rows].mean(0), atol=1e-6)
        np.testing.assert_allclose(new_h[:, TAG_IDS[tag]], old_h[:, rows].mean(1), atol=1e-6)
    assert not new_e[113:].any() and not new_h[:, 113:].any()
    old_leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]
    new_leaves = dict(jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(grown)))[0])
    for path, value in old_leaves:  # every other parameter unchanged
        if "embed" not in str(path) and "lm_head" not in str(path):
            np.testing.assert_array_equal(np.asarray(new_leaves[path]), np.asarray(value))
    with pytest.raises(ConfigError, match="grows"):
        resize_vocab(model, 64)
    with pytest.raises(ConfigError, match="init_rows"):
        resize_vocab(model, 128, {50: [1]})


def test_parts_formats_and_checker():
    task = get_task("parts")
    prompt = "par rev rot swp: 1=314 2=520 3=761 4=802="
    seq = "rev:413 rot:134 swp:314;rev:025 rot:250 swp:520;rev:167 rot:671 swp:761;rev:208 rot:082 swp:802;=3578"
    mv = ("<Parallel><Goal><Outline>1</Outline><Outline>2</Outline><Outline>3</Outline><Outline>4</Outline></Goal>"
          "<Path>1:rev:413 rot:134 swp:314</Path><Path>2:rev:025 rot:250 swp:520</Path>"
          "<Path>3:rev:167 rot:671 swp:761</Path><Path>4:rev:208 rot:082 swp:802</Path>"
          "<Conclusion>3578</Conclusion></Parallel>")
    assert task.sequential(prompt) == seq and task.multiverse(prompt) == mv
    for text in (seq, mv, strip_tags(mv), f" {seq}\n"):
        assert task.check(prompt, text) and task.final_answer(prompt, text) == "3578"
    assert not task.check(prompt, seq.replace("rot:250", "rot:205"))  # one wrong intermediate step
    assert not task.check(prompt, seq[:-1] + "9")
    assert not task.check(prompt, mv.replace("<Path>2:", "<Path>3:", 1))
    assert task.sequential_length(seq) == 102 and task.multiverse_chain_length(mv) == 50
    assert task.parse_prompt(prompt) == (["rev", "rot", "swp"], ["314", "520", "761", "802"])
    for bad in ("par rev: 31=", "par rev rot swp: 314 520 761 802=",  # unlabelled lists
                "par rev rot swp: 1=314 3=520 2=761=", "par rev rot swp: 2=314 3=520 4=761="):  # labels not 1, 2, ...
        with pytest.raises(DataError, match="cannot read prompt"):
            task.check(bad, seq)
    rng = np.random.default_rng(0)
    p, r = get_task("parts_mv").generate(rng)
    assert r == task.multiverse(p) and task.check(p, r)
    lists = task.parse_prompt(p)[1]
    assert p.endswith(" ".join(f"{k}={x}" for k, x in enumerate(lists, 1)) + "=")  # each list after its path's label
    with pytest.raises(ConfigError, match="min_parts"):
        PartsTask(min_parts=1)


def test_chain_is_at_least_1_8_times_shorter_on_average():
    task, rng = PartsTask(), np.random.default_rng(3)
    prompts = [task.draw_prompt(rng) for _ in range(400)]
    seq = np.mean([task.sequential_length(task.sequential(p)) for p in prompts])
    chain = np.mean([task.multiverse_chain_length(task.multiverse(p)) for p in prompts])
    assert seq / chain >= 1.8


def test_curriculum_stages_in_order():
    task = PartsTask()
    rows = curriculum(task, 20, seed=0)
    assert len(rows) == 8 * 20 and len(STAGES) == 6
    is_mv = np.array(["<Parallel>" in e.response for e in rows])
    bounds = np.cumsum([0, 40, 20, 20, 20, 20, 40])
    counts = [int(is_mv[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]
    assert counts == [0, 2, 10, 10, 18, 40]
    prompts = [e.prompt for e in rows]
    assert prompts[:20] == prompts[20:40] == prompts[-40:-20] == prompts[-20:]  # S twice, M twice, same instances
    assert sorted(prompts[60:80]) == sorted(prompts[:10] * 2)  # mixed first halves: both formats
    assert all(task.check(e.prompt, e.response) for e in rows)
    baseline = curriculum(task, 20, seed=0, multiverse=False)
    assert [e.prompt for e in baseline] == prompts and not any("<" in e.response for e in baseline)
