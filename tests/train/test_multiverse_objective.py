"""The `multiverse` objective against an independent dense computation: transformers' `Qwen2ForCausalLM`
with a 4-D float mask and position ids from the published rules written out in
`tests/support/multiverse_reference.py`, and the plain next-token loss over the response, less the
tokens the fork/merge decoder supplies (a path's label after `<Path>`, the token after `</Path>`), found
here by walking the tokens."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm.data import BatchConfig, make_batch_iterator
from jaxdllm.data.multiverse_tags import TAG_IDS, build_tag_tokenizer
from jaxdllm.data.parts_task import PartsTask, curriculum
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives import Views, make_objective
from support.hf_models import make_hf_model
from support.multiverse_reference import reference_layout
from support.optional import torch

TAG_OF = {i: t for t, i in TAG_IDS.items()}
COLON = build_tag_tokenizer().token_to_id(":")
TASK = PartsTask(name="parts_small", min_parts=2, max_parts=3, num_ops=2)


def batch_of(examples, rows):
    tok = build_tag_tokenizer()
    seq_len = max(len(tok.encode(e.prompt + e.response, add_special_tokens=False)) for e in examples) + 4
    it = make_batch_iterator(examples, tok, BatchConfig(seq_len=seq_len, batch_size=rows, shuffle=False))
    return {k: np.asarray(v) for k, v in next(it).items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa", seed=3)  # vocabulary 128: the tag ids 101..112 fit
    with torch.no_grad():
        hf.lm_head.weight.mul_(10.0)
    path = tmp_path_factory.mktemp("multiverse_objective")
    hf.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": 2, "pad_token_id": 0, "bos_token_id": 1}))
    return jaxdllm.from_pretrained(path, attention_impl="xla"), hf


def student_of(model):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda t, p, m: nnx.merge(graphdef, state)(t, positions=p, attention=m).logits)


def decoder_supplied(names):
    """Walk one row's token names: the label after each `<Path>` up to the ':', and the token after `</Path>`."""
    out, in_label, after_close = [], False, False
    for name in names:
        if name == "<Path>":
            out.append(after_close)
            in_label = True
        else:
            in_label = in_label and name != str(COLON)
            out.append(in_label or after_close)
        after_close = name == "</Path>"
    return np.array(out)


def test_the_decoder_supplied_tokens_are_the_path_labels_and_what_follows_a_path():
    tok = build_tag_tokenizer()
    prompt = "par rev rot swp: 1=314 2=520 3=761="
    ids = tok.encode(prompt + PartsTask().multiverse(prompt), add_special_tokens=False)
    supplied = np.asarray(make_objective("multiverse", {}).decoder_supplied(np.array([ids])))[0]
    assert [tok.decode([i]) for i, s in zip(ids, supplied) if s] == ["1", "<Path>", "2", "<Path>", "3", "<Conclusion>"]
    assert not np.asarray(make_objective("multiverse", {}).decoder_supplied(np.array([tok.encode(prompt)]))).any()


def test_loss_equals_a_dense_torch_forward_under_the_published_rules(checkpoint):
    model, hf = checkpoint
    examples = curriculum(TASK, 8, seed=1)
    mixed = [e for e in examples if "<Parallel>" in e.response][:3] + [e for e in examples if "<" not in e.response][:2]
    b = batch_of(mixed, len(mixed))
    objective = make_objective("multiverse", {}, model.config)
    loss, metrics = objective(Views(student=student_of(model), config=model.config), b, jax.random.PRNGKey(0))

    tokens, target, seg = b["tokens"], b["target_mask"].astype(bool), b["segment_ids"]
    rows, n = tokens.shape
    bias, pos = [], []
    for r in range(rows):
        p, visible = reference_layout([TAG_OF.get(int(i), str(int(i))) for i in tokens[r]])
        visible &= seg[r][:, None] == seg[r][None, :]
        bias.append(np.where(visible, 0.0, np.finfo(np.float32).min))
        pos.append(p)
    assert any((p != np.arange(n)).any() for p in pos)  # the rows with tags are shifted
    with torch.no_grad():
        logits = hf(torch.as_tensor(tokens.astype(np.int64)), attention_mask=torch.as_tensor(np.array(bias)[:, None],
                                                                                             dtype=torch.float32),
                    position_ids=torch.as_tensor(np.array(pos))).logits.double()
    logp = torch.log_softmax(logits, -1).numpy()
    supplied = np.array([decoder_supplied([TAG_OF.get(int(i), str(int(i))) for i in tokens[r]]) for r in range(rows)])
    assert supplied[:3].sum() >= 3 * 2 * 2 and not supplied[3:].any()  # >= 2 paths each: 2 labels, 2 after </Path>
    ce = [-logp[r, i - 1, tokens[r, i]] for r in range(rows) for i in range(1, n)
          if target[r, i] and not supplied[r, i]]
    np.testing.assert_allclose(float(loss), np.mean(ce), rtol=1e-4)
    assert int(metrics["masked_tokens"]) == len(ce) == target[:, 1:].sum() - supplied[:, 1:].sum()


def test_rows_without_tags_give_exactly_the_causal_lm_loss(checkpoint):
    model, _ = checkpoint
    examples = [e for e in curriculum(TASK, 8, seed=2) if "<" not in e.response][:4]
    b = batch_of(examples, 4)
    views = Views(student=student_of(model), config=model.config)
    mv, mv_metrics = make_objective("multiverse", {}, model.config)(views, b, jax.random.PRNGKey(0))
    lm, lm_metrics = make_objective("causal_lm", {}, model.config)(views, b, jax.random.PRNGKey(0))
    assert float(mv) == float(lm)
    assert float(mv_metrics["masked_accuracy"]) == float(lm_metrics["masked_accuracy"])


def test_bad_settings_and_models_are_refused(checkpoint):
    model, _ = checkpoint
    with pytest.raises(ConfigError, match="max_depth"):
        make_objective("multiverse", {"max_depth": 0})
    with pytest.raises(ConfigError, match="colon_id"):
        make_objective("multiverse", {"colon_id": -1})
    with pytest.raises(ConfigError, match="rows: grow it first"):
        make_objective("multiverse", {}, model.config.replace(vocab_size=101))
    with pytest.raises(ConfigError, match="causal"):
        make_objective("multiverse", {}, model.config.replace(attention="bidirectional"))
