"""Data: task checkers accept every valid answer and reject wrong ones, deterministic disjoint
splits, JSONL errors with line numbers, the character tokenizer, resumable batching, GSM8K."""

import dataclasses
import json
import warnings

import numpy as np
import pytest

import jaxdllm.data.gsm8k as gsm8k_module
from jaxdllm.data.gsm8k import load_fewshot

from jaxdllm import ConfigError, ModelConfig, Tokenizer
from jaxdllm.data import (BatchConfig, BatchIterator, CopyTask, DataError, DatasetNotFoundError, Example,
                          JsonlConfig, PickTask, SpecialIds, WordProblemTask, build_char_tokenizer,
                          decode_response, default_gsm8k_dir, get_task, instance_split, load_gsm8k,
                          make_batch_iterator, make_mixture, make_split, read_jsonl, register_task,
                          save_char_tokenizer, special_token_ids, task_names, tokenize_examples, write_jsonl)
from jaxdllm.data.char_tokenizer import BOS_ID, CHARS, EOS_ID, MASK_ID, PAD_ID, VOCAB_SIZE

SINGLE = ["copy", "reverse", "sort", "add", "copy_long", "reverse_long", "sort_long", "chain", "parts", "parts_mv", "parts_small"]
MANY = ["perm", "pick3", "twin", "word_problems"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


# -- tasks --------------------------------------------------------------------------------------
def test_registry_lists_the_suite():
    assert task_names(many_answers=False) == SINGLE
    assert task_names(many_answers=True) == MANY
    with pytest.raises(ConfigError, match="already registered"):
        register_task(CopyTask())
    with pytest.raises(ConfigError, match="registered tasks: .*'reverse'"):
        get_task("revers")


@pytest.mark.parametrize("name", SINGLE + MANY)
def test_checker_accepts_generated_answers(name):
    task = get_task(name)
    examples = make_split(name, 300, seed=1)
    assert all(task.check(e.prompt, e.response) for e in examples)
    assert all(task.check(e.prompt, f"  {e.response}\n") for e in examples[:20])  # outer whitespace
    assert all(e.task == name for e in examples)


@pytest.mark.parametrize("prompt,right,wrong", [
    ("copy 31415=", "31415", ["3141", "314155", "31451", "", "3 1415", "x"]),
    ("reverse 31425=", "52413", ["31425", "5241", "52431", "524133"]),
    ("sort 31415=", "11345", ["1345", "13145", "113455", "54311"]),
    ("123+989=", "1112", ["1111", "112", "01112", "1112.5", "-1112"]),
])
def test_single_answer_checkers_reject_wrong(prompt, right, wrong):
    name = {"c": "copy", "r": "reverse", "s": "sort"}.get(prompt[0], "add")
    task = get_task(name)
    assert task.check(prompt, right)
    for response in wrong:
        assert not task.check(prompt, response), response


def test_long_variants_draw_10_to_16_digits_from_their_own_split():
    """The long-answer tasks: 10-16 digits (11-17 answer tokens with EOS), the same checkers, and
    held-out prompts of their own (a test prompt of `copy_long` is in no training split of it)."""
    for name, solve in (("copy_long", lambda d: d), ("reverse_long", lambda d: d[::-1]),
                        ("sort_long", lambda d: "".join(sorted(d)))):
        examples = make_split(name, 400, seed=3)
        lengths = {len(e.response) for e in examples}
        assert min(lengths) == 10 and max(lengths) == 16, lengths
        assert all(e.response == solve(e.prompt.split(" ")[1][:-1]) for e in examples)
        assert get_task(name).description.endswith("10-16 digit list" + (" ascending" if "sort" in name else ""))
        test = {e.prompt for e in make_split(name, 100, seed=0, split="test")}
        assert not test & {e.prompt for e in make_split(name, 2000, seed=5)}
    assert get_task("reverse_long").check("reverse 0123456789012=", "2109876543210 ")
    assert not get_task("reverse_long").check("reverse 0123456789012=", "109876543210")  # one digit short
    assert get_task("copy").description == "copy a 4-8 digit list"


def test_permutation_accepts_any_ordering():
    task = get_task("perm")
    prompt = "perm 3142="
    for response in ["3142", "1234", "4321", "2413"]:
        assert task.check(prompt, response)
    for response in ["3141", "314", "31420", "1123", "3 142", "abcd", ""]:
        assert not task.check(prompt, response), response


def test_pick_accepts_any_k_items():
    task = get_task("pick3")
    prompt = "pick 3 from 31425="
    for response in ["314", "531", "245", "152", "425"]:
        assert task.check(prompt, response)
    for response in ["33 ", "334", "316", "31", "3142", "31a", ""]:
        assert not task.check(prompt, response), response


def test_twin_needs_two_equal_digits_of_the_list():
    task = get_task("twin")
    prompt = "twin 31425="
    for response in ["33", "11", "55", " 44\n"]:
        assert task.check(prompt, response)
    for response in ["34", "66", "3", "333", "3 3", "aa", ""]:  # disagreeing, absent, wrong length
        assert not task.check(prompt, response), response
    with pytest.raises(ConfigError, match="k <= min_len"):
        PickTask(name="pick9", k=9)


def test_task_configs_are_validated():
    with pytest.raises(ConfigError, match="min_len <= max_len"):
        CopyTask(name="c2", min_len=6, max_len=4)
    with pytest.raises(ConfigError, match="at most 10"):
        get_task("perm").__class__(name="p2", max_len=12)
    with pytest.raises(ConfigError, match="lowercase"):
        CopyTask(name="Bad Name")
    with pytest.raises(ValueError, match="cannot read prompt"):
        get_task("copy").check("reverse 123=", "321")


def test_word_problem_accepts_reordered_and_rephrased_solutions():
    task = get_task("word_problems")
    prompt = "ann has 4 pens, gets 3. bob has 2 pens, gets 6. how many now?"
    valid = ["ann: 4+3=7\nbob: 2+6=8\ntotal: 7+8=15\n#### 15",
             "bob: 6+2=8\nann: 3+4=7\ntotal: 8+7=15\n#### 15",  # other order, operands swapped
             "2+6=8 for bob\nfor ann, 4+3=7\nso 8+7=15\n#### 15",
             "  ann: 4+3=7\n\nbob: 2+6=8 \n7+8=15 in all\n#### 15\n"]  # whitespace, blank line
    for response in valid:
        assert task.check(prompt, response), response
    assert len(task.solutions(prompt)) == 2 * 6 * 6 * 6
    invalid = ["ann: 4+3=7\nbob: 2+6=8\ntotal: 7+8=15\n#### 16",  # wrong final number
               "ann: 4+3=8\nbob: 2+6=8\ntotal: 8+8=16\n#### 16",  # wrong intermediate
               "bob: 4+3=7\nann: 2+6=8\ntotal: 7+8=15\n#### 15",  # names swapped
               "ann: 4+3=7 for ann\nbob: 2+6=8\ntotal: 7+8=15\n#### 15",  # two phrasings mixed in a line
               "ann: 4+3=7\ntotal: 7+8=15\n#### 15",  # a line missing
               "total: 7+8=15\nann: 4+3=7\nbob: 2+6=8\n#### 15",  # combining line first
               "#### 15", ""]
    for response in invalid:
        assert not task.check(prompt, response), response
    # The final-number rule accepts anything ending in the right number.
    assert task.check_final_answer(prompt, "#### 15")
    assert task.check_final_answer(prompt, invalid[2])
    assert not task.check_final_answer(prompt, invalid[0])
    lenient = WordProblemTask(name="word_problems_final", check_lines=False)
    assert lenient.check(prompt, "#### 15") and not lenient.check(prompt, "#### 14")
    # Subtraction: operands keep their order.
    prompt = "eve has 12 cups, loses 5. tom has 10 cups, loses 1. how many now?"
    assert task.check(prompt, "tom: 10-1=9\neve: 12-5=7\nso 9+7=16\n#### 16")
    assert not task.check(prompt, "tom: 1-10=9\neve: 12-5=7\nso 9+7=16\n#### 16")


def test_word_problem_generator_covers_orders_and_phrasings():
    task = get_task("word_problems")
    examples = make_split(task, 300, seed=3)
    first_lines = set()
    for e in examples:
        assert e.response in task.solutions(e.prompt)
        assert e.answer == e.response.rsplit("#### ", 1)[1] == str(task.answer(e.prompt))
        first_lines.add(e.response.split("\n")[0].split(" ")[0].rstrip(":,"))
    assert {"gets", "loses", "bags"} <= {w.rstrip(",") for e in examples for w in e.prompt.split()}
    assert len(first_lines) > 5  # both people first, in several phrasings


def test_splits_are_deterministic_and_disjoint():
    for name in SINGLE + MANY:
        a = make_split(name, 200, seed=7)
        assert a == make_split(name, 200, seed=7)
        assert a != make_split(name, 200, seed=8)
        assert len({e.prompt for e in a}) == 200  # unique within the split
        test = make_split(name, 100, seed=7, split="test")
        train = make_split(name, 2000, seed=11)
        assert not {e.prompt for e in train} & {e.prompt for e in test}
        assert all(instance_split(name, e.prompt) == "test" for e in test)
    mixture = make_mixture(["copy", "add"], 5, seed=0)
    assert [e.task for e in mixture] == ["copy"] * 5 + ["add"] * 5
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert get_task("word_problems").generate(rng_a) == get_task("word_problems").generate(rng_b)


def test_split_errors():
    tiny = CopyTask(name="copy1", min_len=1, max_len=1)  # only 10 instances
    with pytest.raises(DataError, match="found only .* unique train instances"):
        make_split(tiny, 50, seed=0)
    assert len(make_split(tiny, 50, seed=0, unique=False)) == 50
    with pytest.raises(ConfigError, match="split must be one of"):
        make_split("copy", 5, seed=0, split="valid")
    with pytest.raises(ConfigError, match="seed"):
        make_split("copy", 5, seed=-1)


# -- JSONL ----------------------------------------------------------------------------------------
def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_jsonl_round_trip(tmp_path):
    examples = make_split("word_problems", 5, seed=0) + make_split("perm", 5, seed=0)
    path = write_jsonl(tmp_path / "sub" / "data.jsonl", examples)
    data = read_jsonl(path)
    assert data.records == examples and data.num_skipped == 0
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"prompt", "response", "task", "answer"}


BAD_LINES = ['{"prompt": "a", "response": "b"}',
             '',
             '{"prompt": "a", "response": "b",}',   # line 3: bad JSON
             '["prompt", "response"]',              # line 4: not an object
             '{"prompt": "a"}',                     # line 5: missing response
             '{"prompt": 3, "response": "b"}',      # line 6: not a string
             '{"prompt": "c", "response": "d", "task": "copy"}']


def test_jsonl_malformed_line_stops_with_line_number(tmp_path):
    path = _write_lines(tmp_path / "bad.jsonl", BAD_LINES)
    with pytest.raises(DataError, match=r'bad\.jsonl:3: invalid JSON .*on_error = "skip"'):
        read_jsonl(path)
    path = _write_lines(tmp_path / "bad5.jsonl", BAD_LINES[:2] + BAD_LINES[4:])
    with pytest.raises(DataError, match=r"bad5\.jsonl:3: missing field 'response'"):
        read_jsonl(path)


def test_jsonl_skip_mode_counts_and_warns(tmp_path):
    path = _write_lines(tmp_path / "bad.jsonl", BAD_LINES)
    with pytest.warns(UserWarning, match=r"skipped 4 malformed line\(s\) \(lines 3, 4, 5, 6\)"):
        data = read_jsonl(path, JsonlConfig(on_error="skip"))
    assert [n for n, _ in data.skipped] == [3, 4, 5, 6]
    assert [(e.prompt, e.task) for e in data] == [("a", ""), ("c", "copy")]
    with pytest.raises(ConfigError, match="on_error"):
        JsonlConfig(on_error="ignore")


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"dataset file .*nope\.jsonl does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError):  # also catchable as the builtin
        read_jsonl(tmp_path / "nope.jsonl")


# -- tokenizer -----------------------------------------------------------------------------------
def test_char_tokenizer_round_trip(tok, tmp_path):
    assert tok.vocab_size == VOCAB_SIZE == 101
    text = CHARS + "copy 31415=\n#### 15"
    ids = tok.encode(text)
    assert ids[0] == BOS_ID and len(ids) == len(text) + 1
    assert tok.decode(ids) == text
    assert tok.encode("\u00e9", add_special_tokens=False) == [tok.token_to_id("<unk>")]
    ids_map = special_token_ids(tok)
    assert ids_map == {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
                       "mask_token_id": MASK_ID, "eot_token_id": None}
    ModelConfig.preset("tiny-llada", vocab_size=tok.vocab_size, **ids_map)  # the ids fit a model config
    loaded = Tokenizer.from_pretrained(save_char_tokenizer(tmp_path))
    for e in make_mixture(task_names(), 3, seed=0):
        assert loaded.encode(e.prompt + e.response) == tok.encode(e.prompt + e.response)
        assert loaded.decode(tok.encode(e.response)) == e.response
    assert special_token_ids(loaded) == ids_map
    generated = tok.encode("579", add_special_tokens=False) + [EOS_ID, EOS_ID, MASK_ID, 20]
    assert decode_response(loaded, generated) == "579"


# -- batching ------------------------------------------------------------------------------------
def _examples():
    return [Example("copy 1234=", "1234", "copy"), Example("12+30=", "42", "add"),
            Example("sort 4213=", "1234", "sort"), Example("reverse 56789=", "98765", "reverse"),
            Example("perm 123=", "321", "perm")]


def test_batch_layout_unpacked(tok):
    config = BatchConfig(seq_len=24, batch_size=5, shuffle=False)
    batch = next(make_batch_iterator(_examples(), tok, config))
    assert {k: (v.shape, v.dtype.kind) for k, v in batch.items()} == {
        "tokens": ((5, 24), "i"), "prompt_mask": ((5, 24), "b"), "target_mask": ((5, 24), "b"),
        "segment_ids": ((5, 24), "i"), "positions": ((5, 24), "i")}
    row = {k: v[1] for k, v in batch.items()}  # "12+30=" -> "42"
    assert tok.decode(row["tokens"], skip_special_tokens=False) == "<bos>12+30=42" + "<eos>" * 15
    assert row["prompt_mask"].tolist() == [True] * 7 + [False] * 17
    assert row["target_mask"].tolist() == [False] * 7 + [True] * 17  # answer + EOS fill
    assert row["segment_ids"].tolist() == [1] * 24
    assert row["positions"].tolist() == list(range(24))
    config = BatchConfig(seq_len=24, batch_size=5, shuffle=False, fill_with_eos=False)
    row = {k: v[1] for k, v in next(make_batch_iterator(_examples(), tok, config)).items()}
    assert row["tokens"].tolist()[9:] == [EOS_ID] + [PAD_ID] * 14
    assert row["target_mask"].tolist() == [False] * 7 + [True] * 3 + [False] * 14
    assert row["segment_ids"].tolist() == [1] * 10 + [0] * 14
    assert row["positions"].tolist() == list(range(10)) + [0] * 14


def test_batch_layout_packed(tok):
    config = BatchConfig(seq_len=32, batch_size=2, shuffle=False, pack=True, fill_with_eos=False)
    batch = next(make_batch_iterator(_examples(), tok, config))
    # Rows hold consecutive examples while they fit: copy (16 tokens) + add (10), then sort (16).
    for r in range(2):
        seg = batch["segment_ids"][r]
        for s in range(1, seg.max() + 1):
            where = np.flatnonzero(seg == s)
            assert batch["positions"][r, where].tolist() == list(range(len(where)))
            assert batch["tokens"][r, where[0]] == BOS_ID and batch["tokens"][r, where[-1]] == EOS_ID
            assert batch["prompt_mask"][r, where].sum() + batch["target_mask"][r, where].sum() == len(where)
        assert (batch["tokens"][r, seg == 0] == PAD_ID).all()
        assert not (batch["prompt_mask"][r] | batch["target_mask"][r])[seg == 0].any()
    assert batch["segment_ids"][0].max() == 2  # copy (16) + add (10) fit, sort (16) does not
    text = tok.decode(batch["tokens"][0], skip_special_tokens=False)
    assert text.startswith("<bos>copy 1234=1234<eos><bos>12+30=42<eos><pad>")
    with pytest.raises(ConfigError, match="fill_with_eos=False"):
        BatchConfig(seq_len=32, batch_size=2, pack=True)


def test_packed_rows_for_a_block_causal_model_start_each_example_on_a_block(tok):
    """A block-causal recipe packs with `align` = the model's block size: copy (16 tokens) at column 0,
    add (10) at 16, then PAD to 32; each example's blocks are where decoding puts them."""
    from jaxdllm.train import TrainConfig
    from jaxdllm.train.setup import batch_config_for

    recipe = TrainConfig.from_dict({"model": {"preset": "tiny-llada2"}, "data": {"seq_len": 40, "batch_size": 2,
                                                                                "pack": True}})
    config = batch_config_for(recipe, ModelConfig.preset("tiny-llada2", block_size=8))
    assert config.align == 8 and batch_config_for(recipe, ModelConfig.preset("tiny-llada")).align == 1
    batch = next(make_batch_iterator(_examples(), tok, dataclasses.replace(config, shuffle=False)))
    seg = batch["segment_ids"][0]
    starts = [int(np.flatnonzero(seg == s)[0]) for s in range(1, seg.max() + 1)]
    assert starts == [0, 16] and seg[26:32].tolist() == [0] * 6  # 10 tokens of add, then PAD to the block
    assert batch["positions"][0, 16:26].tolist() == list(range(10))


@pytest.mark.parametrize("pack", [False, True])
def test_iterator_resumes_exactly(tok, pack):
    examples = make_mixture(["copy", "add", "word_problems"], 20, seed=0)
    config = BatchConfig(seq_len=128, batch_size=4, seed=3, pack=pack, fill_with_eos=not pack)
    straight = make_batch_iterator(examples, tok, config)
    expected = [next(straight) for _ in range(40)]  # crosses epochs: 60 examples, 4 rows a batch
    assert straight.epoch >= 2
    first = make_batch_iterator(examples, tok, config)
    for _ in range(11):
        next(first)
    state = json.loads(json.dumps(first.get_state()))  # JSON-able, as a checkpoint stores it
    resumed = make_batch_iterator(examples, tok, config, state=state)
    for want in expected[11:]:
        got = next(resumed)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    other_seed = make_batch_iterator(examples, tok, BatchConfig(seq_len=128, batch_size=4, seed=4, pack=pack,
                                                                fill_with_eos=not pack))
    assert not np.array_equal(next(other_seed)["tokens"], expected[0]["tokens"])
    with pytest.raises(DataError, match="seed=3, but this iterator has seed=4"):
        other_seed.set_state(state)


def test_iterator_epochs_and_shards(tok):
    examples = make_split("reverse", 10, seed=0)
    config = BatchConfig(seq_len=32, batch_size=4, num_epochs=2)
    batches = list(make_batch_iterator(examples, tok, config))
    assert len(batches) == 5  # 20 rows
    rows = np.concatenate([b["tokens"] for b in batches])
    equals = tok.token_to_id("=")
    prompts = [tok.decode(r[:r.tolist().index(equals)]) for r in rows]
    assert sorted(prompts[:10]) == sorted(prompts[10:]) == sorted(e.prompt[:-1] for e in examples)
    assert prompts[:10] != prompts[10:]  # a new order each epoch
    config = BatchConfig(seq_len=32, batch_size=4, num_epochs=1)
    last = list(make_batch_iterator(examples, tok, config))[-1]  # 10 = 4 + 4 + 2 rows
    assert (last["segment_ids"][2:] == 0).all() and (last["segment_ids"][:2] > 0).all()
    full = next(make_batch_iterator(examples, tok, BatchConfig(seq_len=32, batch_size=4)))
    parts = [next(make_batch_iterator(examples, tok, BatchConfig(seq_len=32, batch_size=4, num_shards=2,
                                                                 shard_index=i))) for i in range(2)]
    assert np.array_equal(np.concatenate([p["tokens"] for p in parts]), full["tokens"])
    with pytest.raises(ConfigError, match="multiple of num_shards"):
        BatchConfig(seq_len=32, batch_size=3, num_shards=2)


def test_batching_bad_input(tok):
    examples = _examples()
    with pytest.raises(DataError, match=r"example 3 \(task 'reverse'\) is 21 tokens .*seq_len=16"):
        tokenize_examples(examples, tok, BatchConfig(seq_len=16, batch_size=2))
    with pytest.warns(UserWarning, match="skipped 1 of 5 examples"):
        kept = tokenize_examples(examples, tok, BatchConfig(seq_len=16, batch_size=2, on_too_long="skip"))
    assert len(kept) == 4
    with pytest.raises(DataError, match=r"example 1 .*does not know: \['\u00e9'\]"):
        tokenize_examples([examples[0], Example("caf\u00e9=", "1")], tok, BatchConfig(seq_len=16, batch_size=2))
    with pytest.raises(ConfigError, match="seq_len must be a positive integer"):
        BatchConfig(seq_len=0, batch_size=2)
    config = BatchConfig(seq_len=16, batch_size=2)
    with pytest.raises(DataError, match="at least one example"):
        BatchIterator([], config, SpecialIds.from_tokenizer(tok, config))


# -- GSM8K ---------------------------------------------------------------------------------------
GSM8K = default_gsm8k_dir()
SHIPPED_DIR = gsm8k_module.SHIPPED_DIR


def test_gsm8k_test_split_ships_with_the_package():
    test = load_gsm8k("test", SHIPPED_DIR)  # the copy in jaxdllm/data/gsm8k_files (MIT)
    assert len(test) == 1319
    assert all(float(e.answer) == float(e.answer) for e in test)  # parses as a number
    assert all(e.task == "gsm8k" and e.prompt and "<<" not in e.response for e in test)
    assert test[0].answer == "18" and test[0].prompt.startswith("Janet\u2019s ducks lay 16 eggs")
    shots = load_fewshot(3, SHIPPED_DIR)
    assert [e.answer for e in shots] == ["72", "10", "5"]  # the train split's first problems
    with pytest.raises(ConfigError, match="only 8 are shipped"):
        load_fewshot(9, SHIPPED_DIR)


@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason=f"GSM8K train split not found at {GSM8K} "
                                                                  "(set JAXDLLM_GSM8K_DIR)")
def test_gsm8k_train_split_loads():
    train = load_gsm8k("train", GSM8K, limit=50)
    assert len(train) == 50 and train[0].answer == "72"
    assert train[0].response.startswith("Natalia sold 48/2 = 24 clips in May.")
    assert load_gsm8k("train", GSM8K, limit=1, keep_calculator=True)[0].response.count("<<") == 2
    assert [e.prompt for e in load_fewshot(8, GSM8K)] == [e.prompt for e in load_fewshot(8, SHIPPED_DIR)]


def test_gsm8k_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"GSM8K directory .*missing does not exist.*JAXDLLM_GSM8K_DIR"):
        load_gsm8k("test", tmp_path / "missing")
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "a\\n#### 1,000"}\n'
                                         '{"question": "q", "answer": "no number"}\n')
    with pytest.raises(DataError, match=r"test\.jsonl:2: the answer has no"):
        load_gsm8k("test", tmp_path)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records = load_gsm8k("test", tmp_path, on_error="skip")
    assert [e.answer for e in records] == ["1000"]
