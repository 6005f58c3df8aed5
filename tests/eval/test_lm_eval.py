"""jaxdllm as an lm-evaluation-harness model: lm-eval on the shipped model with the local task
configs gives the same responses and accuracy as `jaxdllm eval` on the same items; the
Monte-Carlo loglikelihood is exact where it must be."""

import json
import shutil

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is the [eval] extra")

import jax  # noqa: E402

from jaxdllm import SamplerConfig, Tokenizer, from_pretrained  # noqa: E402
from jaxdllm.cli import DEFAULT_MODEL  # noqa: E402
from jaxdllm.eval import ItemStore, evaluate, resolve_tasks, run_task  # noqa: E402
from jaxdllm.eval.harness import JaxdllmLM, cut_at_stops  # noqa: E402
from jaxdllm.eval.lm_eval_cli import TASK_DIR  # noqa: E402
from support.optional import torch, transformers  # noqa: E402

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").is_file(), reason="no shipped checkpoint")
SAMPLER = dict(preset="fast-dllm-parallel", gen_length=16, block_length=16)


def _lm_eval(model_dir, tasks, metadata, batch_size, **extra):
    from lm_eval.tasks import TaskManager

    args = ",".join(f"{k}={v}" for k, v in {"pretrained": model_dir, **SAMPLER, **extra}.items())
    return lm_eval.simple_evaluate(model="jaxdllm", model_args=args, tasks=tasks, batch_size=batch_size,
                                   task_manager=TaskManager(include_path=str(TASK_DIR), metadata=metadata),
                                   log_samples=True)


def _responses(out, task):
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples], [s["acc"] for s in samples]


@pytest.mark.slow  # ~23 s: lm-eval end to end
def test_lm_eval_equals_jaxdllm_eval_on_suite_items(tmp_path):
    model, tok = from_pretrained(DEFAULT_MODEL, dtype="float32"), Tokenizer.from_pretrained(DEFAULT_MODEL)
    config = SamplerConfig.preset(SAMPLER["preset"], gen_length=16, block_length=16)
    for name in ("reverse", "pick3"):  # one answer; many answers scored by the checker
        out = _lm_eval(DEFAULT_MODEL, [f"jaxdllm_suite_{name}"], {"n": 24, "seed": 1234}, 8)
        responses, accs = _responses(out, f"jaxdllm_suite_{name}")
        task = resolve_tasks(name)[0]
        ours = run_task(model, tok, task, task.items(24, 1234), config, key="k", store=ItemStore(None), batch_size=8)
        assert responses == [r["response"] for r in ours]
        assert accs == [float(r["correct"]) for r in ours]
        assert out["results"][f"jaxdllm_suite_{name}"]["acc,none"] == pytest.approx(np.mean(accs))
        report = evaluate(model, tok, [task], {"s": config}, n=24, batch_size=8, progress=False, log=lambda _: None)
        assert report["results"]["s"][name]["accuracy"] == pytest.approx(out["results"][f"jaxdllm_suite_{name}"]["acc,none"])


@pytest.mark.slow
def test_lm_eval_gsm8k_local_task_scores_like_jaxdllm_eval(tmp_path):
    """GSM8K from the local files: the same responses and numeric scoring as `jaxdllm eval --tasks gsm8k`.
    (The shipped digit model cannot solve GSM8K; its context is widened so that the questions fit.)"""
    model_dir = tmp_path / "wide"
    shutil.copytree(DEFAULT_MODEL, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"max_sequence_length": 1024}))
    out = _lm_eval(model_dir, ["jaxdllm_gsm8k"], {"n": 3}, 3)
    responses, accs = _responses(out, "jaxdllm_gsm8k")
    model, tok = from_pretrained(model_dir, dtype="float32"), Tokenizer.from_pretrained(model_dir)
    task = resolve_tasks("gsm8k", gsm8k_chat=False)[0]
    items = task.items(3, 0)
    cfg = SamplerConfig.preset(SAMPLER["preset"], gen_length=16, block_length=16)
    ours = run_task(model, tok, task, items, cfg, key="k", store=ItemStore(None), batch_size=3)
    assert [cut_at_stops(r["response"], ["Question:"]) for r in ours] == responses
    assert accs == [float(r["correct"]) for r in ours]


def test_cut_at_stops():
    assert cut_at_stops("42\nQuestion: x", ["Question:", "</s>"]) == "42\n"
    assert cut_at_stops("abc", []) == "abc" and cut_at_stops("a</s>b", "</s>") == "a"


class _Request:
    def __init__(self, *args):
        self.args = args


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_masked_loglikelihood_of_one_token_is_exact():
    """With a one-token continuation every Monte-Carlo sample masks that token, so the estimate is
    log p(token | context, [MASK]) read off one dense forward."""
    lm = JaxdllmLM(pretrained=str(DEFAULT_MODEL), mc_num=8, mc_batch=4)
    model, tok = lm.model, lm.tokenizer
    ctx, cont = tok.encode("reverse 4821="), tok.encode("1", add_special_tokens=False)
    estimate = lm.masked_loglikelihood(ctx, cont, jax.random.PRNGKey(0))
    logits = np.asarray(model(np.asarray([ctx + [model.config.mask_token_id]], np.int32)).logits[0, -1], np.float64)
    exact = logits[cont[0]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    assert estimate == pytest.approx(exact, abs=1e-4)
    [(ll, greedy)] = lm.loglikelihood([_Request("reverse 4821=", "1")], disable_tqdm=True)
    assert greedy and ll == pytest.approx(exact, abs=1e-4)  # the model answers 1284


def test_causal_loglikelihood_equals_transformers():
    """A causal model scores a continuation in one forward: the sum of log p(cont_i | ctx, cont_<i) that
    transformers computes on the same checkpoint, and whether greedy decoding writes the continuation."""
    path = DEFAULT_MODEL.parent / "tasks-qwen2-small"
    lm = JaxdllmLM(pretrained=str(path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    answers = ("1284", "1248")  # the model answers 1284
    got = lm.loglikelihood([_Request("reverse 4821=", a) for a in answers], disable_tqdm=True)
    ctx = lm.tokenizer.encode("reverse 4821=")
    for answer, (ll, greedy) in zip(answers, got):
        cont = lm.tokenizer.encode(answer, add_special_tokens=False)
        with torch.no_grad():
            logp = hf(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1].double().log_softmax(-1).numpy()
        assert ll == pytest.approx(logp[np.arange(len(cont)), cont].sum(), abs=1e-4)
        assert greedy == (logp.argmax(-1) == cont).all()
    assert [greedy for _, greedy in got] == [True, False]


def test_masked_loglikelihood_ranks_the_right_answer_first():
    lm = JaxdllmLM(pretrained=str(DEFAULT_MODEL), mc_num=32, mc_batch=16)
    lls = lm.loglikelihood([_Request("reverse 4821=", a) for a in ("1284", "4821", "1248")], disable_tqdm=True)
    assert lls[0][0] > max(lls[1][0], lls[2][0]) and lls[0][1] and not lls[1][1]
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([_Request("x")])
    with pytest.raises(Exception, match="unknown jaxdllm model_args"):
        JaxdllmLM(pretrained=str(DEFAULT_MODEL), treshold=0.5)
