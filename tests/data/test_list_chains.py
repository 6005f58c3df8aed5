"""The chain task (chained list operations with a worked trace): generator and checker."""

import numpy as np
import pytest

from jaxdllm.data import ListChainTask, get_task, instance_split, make_split
from jaxdllm.data.list_chains import STEP_FORMS, apply_operations
from jaxdllm.errors import ConfigError, DataError

TASK = get_task("chain")
PROMPT = "chain 3142 rev rot swp="
# Worked by hand: rev 3142 -> 2413, rot 2413 -> 4132, swp 4132 -> 1432.
RIGHT = "rev 3142>2413\nrot: 4132\n4132 -swp-> 1432\n#### 1432"


def test_a_hand_worked_example_is_right_in_every_phrasing():
    assert apply_operations("3142", ["rev", "rot", "swp"]) == ["2413", "4132", "1432"]
    assert TASK.check(PROMPT, RIGHT)
    assert TASK.answer(PROMPT) == "1432" and TASK.final_answer(PROMPT, RIGHT) == "1432"
    steps = [("rev", "3142", "2413"), ("rot", "2413", "4132"), ("swp", "4132", "1432")]
    for form in STEP_FORMS:  # the same phrasing on every line
        lines = [form.format(op=op, before=b, after=a) for op, b, a in steps]
        assert TASK.check(PROMPT, "\n".join(lines + ["#### 1432"]))
    assert TASK.check(PROMPT, "  " + RIGHT.replace("\n", " \n\n ") + "\n")  # whitespace around lines


def test_operations_have_their_published_orders():
    for items in ("3142", "90817", "52"):
        assert apply_operations(items, ["rev", "rev"])[-1] == items
        assert apply_operations(items, ["swp", "swp"])[-1] == items
        assert apply_operations(items, ["rot"] * len(items))[-1] == items
        assert apply_operations(items, ["rot"])[-1] != items


@pytest.mark.parametrize("response", [
    RIGHT.replace("#### 1432", "#### 1423"),                      # wrong final list
    RIGHT.replace("#### 1432", "#### 1432 "[:-1] + "2"),          # final list one digit too long
    RIGHT.replace("rot: 4132", "rot: 4123"),                      # wrong intermediate, right final
    RIGHT.replace("rev 3142>2413", "rev 3142>2431"),              # wrong first step, right final
    RIGHT.replace("rev 3142>2413", "rev 3124>2413"),              # wrong list before
    RIGHT.replace("rev 3142", "rot 3142"),                        # wrong operation name
    RIGHT.replace("rot: 4132", "rot 4132"),                       # two phrasings mixed in one line
    RIGHT.replace("rot: 4132\n", ""),                             # a line missing
    RIGHT.replace("#### 1432", "rot: 4132\n#### 1432"),            # a line too many
    "\n".join(RIGHT.split("\n")[1:2] + RIGHT.split("\n")[:1] + RIGHT.split("\n")[2:]),  # lines swapped
    "#### 1432",                                                  # the answer without the work
    RIGHT.replace("#### ", "### "),
    RIGHT.replace("#### 1432", "1432"),
    "", "rev", "\n\n",
])
def test_near_misses_are_rejected(response):
    assert not TASK.check(PROMPT, response)


def test_final_answer_check_reads_only_the_last_line():
    work_wrong = RIGHT.replace("rot: 4132", "rot: 4123")
    assert TASK.check_final_answer(PROMPT, work_wrong) and not TASK.check(PROMPT, work_wrong)
    assert not TASK.check_final_answer(PROMPT, RIGHT.replace("#### 1432", "#### 1342"))
    assert TASK.final_answer(PROMPT, "no answer") is None


def test_generator_is_deterministic_and_every_answer_checks():
    a = make_split("chain", 300, seed=5)
    b = make_split("chain", 300, seed=5)
    assert [(e.prompt, e.response) for e in a] == [(e.prompt, e.response) for e in b]
    assert [e.prompt for e in make_split("chain", 300, seed=6)] != [e.prompt for e in a]
    lengths = [len(e.response) for e in a]
    assert 39 <= min(lengths) and max(lengths) <= 60          # 40-61 answer tokens with EOS
    for e in a:
        assert TASK.check(e.prompt, e.response), (e.prompt, e.response)
        assert e.answer == TASK.answer(e.prompt) == e.response.rsplit("#### ", 1)[1]
        assert len(set(e.prompt.split()[1])) == 4             # distinct digits


def test_phrasings_follow_their_weights():
    examples = make_split("chain", 2000, seed=0)
    counts = np.zeros(len(STEP_FORMS))
    for e in examples:
        for line in e.response.split("\n")[:-1]:
            counts[0 if ">" in line and "->" not in line else 1 if ":" in line else 2] += 1
    share = counts / counts.sum()
    np.testing.assert_allclose(share, TASK.form_weights, atol=0.02)
    single = ListChainTask(name="chain_one_form", form_weights=(1.0, 0.0, 0.0))
    rng = np.random.default_rng(0)
    assert all(":" not in single.generate(rng)[1] for _ in range(50))


def test_train_and_test_splits_are_disjoint():
    train = {e.prompt for e in make_split("chain", 3000, seed=0, split="train")}
    test = {e.prompt for e in make_split("chain", 300, seed=0, split="test")}
    assert not train & test
    assert all(instance_split("chain", p) == "test" for p in test)


def test_bad_settings_and_foreign_prompts_fail_clearly():
    for bad in ({"num_items": 1}, {"num_items": 11}, {"num_steps": 0}, {"form_weights": (0.5, 0.5)},
                {"form_weights": (0.5, 0.3, 0.3)}, {"form_weights": (1.2, -0.1, -0.1)}):
        with pytest.raises(ConfigError):
            ListChainTask(name="bad", **bad)
    for prompt in ("reverse 3142=", "chain 3142 rev rot=", "chain 3142 rev rot flip=", "chain 314 rev rot swp="):
        with pytest.raises(DataError, match="cannot read prompt"):
            TASK.check(prompt, RIGHT)
