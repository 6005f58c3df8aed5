"""Token-tree draft-and-verify decoding (Medusa, blockwise parallel decoding, Token Recycling).

Greedy acceptance is exact: the output equals transformers' greedy `generate` of the same
checkpoint, on held-out prompts of different lengths in one batch (the shipped causal model with
its shipped Medusa heads, so drafts are accepted several tokens at a time). Typical acceptance is
checked against the published rule computed here, node by node, in NumPy. The head objective is
checked against a property of its initialisation: zero heads are the model's own next-token head,
so head 0's loss is the model's cross-entropy two tokens ahead."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.checkpoint import save_pretrained
from jaxdllm.data import make_mixture
from jaxdllm.decoding.policies.draft_verify import VerifyLayout
from jaxdllm.decoding.policies.medusa import (HEADS_FILE, MEDUSA_63, Medusa, choices_tree, heads_facts, load_heads,
                                              save_heads, typical_accept)
from jaxdllm.errors import CheckpointError
from jaxdllm.eval.runner import left_pad
from jaxdllm.models.medusa import MedusaHeads
from jaxdllm.shipped import checkpoint_dir
from jaxdllm.tokenizer import Tokenizer
from support.optional import torch, transformers
from test_jacobi import assert_greedy_up_to_eos

SHIPPED = checkpoint_dir("tasks-qwen2-small")


@pytest.fixture(scope="module")
def shipped():
    model = jaxdllm.from_pretrained(SHIPPED)
    tok = Tokenizer.from_pretrained(SHIPPED)
    hf = transformers.AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    examples = make_mixture(["reverse_long", "copy_long", "add", "sort"], 2, 99, split="test")
    ids, mask = left_pad([tok.encode(e.prompt) for e in examples], model.config.pad_token_id or 0)
    return model, hf, ids, mask


def hf_greedy_eos(hf, ids, mask, gen, eos, pad):
    with torch.no_grad():
        out = hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long), max_new_tokens=gen,
                          attention_mask=torch.as_tensor(mask, dtype=torch.long), do_sample=False,
                          pad_token_id=pad, eos_token_id=eos)
    got = out[:, ids.shape[1]:].numpy()
    return np.pad(got, ((0, 0), (0, gen - got.shape[1])), constant_values=eos)  # generate stops when all end


# Token Recycling and Medusa run by default; blockwise parallel decoding (Medusa's code on a chain) in the slow run.
@pytest.mark.parametrize("preset", ["medusa", "token-recycling", pytest.param("bpd", marks=pytest.mark.slow)])
def test_tree_drafts_equal_transformers_greedy_on_the_shipped_model(shipped, preset):
    model, hf, ids, mask = shipped
    gen, eos, pad = 24, model.config.eos_token_id, model.config.pad_token_id or 0
    config = SamplerConfig.preset(preset, gen_length=gen)
    params = jaxdllm.policy_params(SHIPPED, config)  # the heads beside the model (None for Token Recycling)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask, policy_params=params)
    want = hf_greedy_eos(hf, ids, mask, gen, eos, pad)
    assert_greedy_up_to_eos(np.asarray(out.tokens)[:, ids.shape[1]:], want, eos)
    answer = [(np.nonzero(row == eos)[0][:1].tolist() or [gen])[0] + 1 for row in want]
    nfe = np.asarray(out.nfe)
    assert (nfe <= np.asarray(answer)).all()
    if preset == "medusa":  # trained heads accept several tokens a forward on these answers
        assert sum(answer) / nfe.sum() >= 2.0, (answer, nfe)


def test_the_published_tree_and_the_chain():
    parents, depth, rank = choices_tree(MEDUSA_63)
    assert len(parents) == 63 and depth.max() == 4 and rank.max() == 9
    for i, p in enumerate(parents):  # a node's path extends its parent's by one rank
        assert (p == -1) == (depth[i] == 1) and (p < i)
    layout = VerifyLayout(0, 0, 0, 0, parents)
    assert layout.length == 64 and layout.accept_width == 5
    np.testing.assert_array_equal(layout.position_offsets()[1:], depth)
    assert SamplerConfig.preset("bpd").policy.layout().tree == (-1, 0, 1, 2)


def naive_typical(tree_paths, logits, nodes_tok, temperature, eps, alpha):
    """The published rule in NumPy: along each candidate path, a token is accepted while
    p(token) > min(eps, alpha * exp(-H(p))) under the parent's softmax(logits / T); the longest
    accepted prefix over the paths wins, ties by the sum of log p. Returns (length, path node ids)."""
    parents, depth, _ = choices_tree(tree_paths)
    p = np.exp(logits / temperature - np.log(np.exp(logits / temperature).sum(-1, keepdims=True)))
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    bar = np.minimum(eps, alpha * np.exp(-h))
    best = (0, 0.0, [])
    for n in range(len(parents)):
        chain_nodes, m = [], n
        while m >= 0:
            chain_nodes.insert(0, m)
            m = parents[m]
        ok, logp = True, 0.0
        for m in chain_nodes:
            at = 0 if parents[m] < 0 else parents[m] + 1   # layout index of the parent
            ok = ok and p[at, nodes_tok[m]] > bar[at]
            logp += np.log(p[at, nodes_tok[m]])
        if ok and (len(chain_nodes), logp) > (best[0], best[1]):
            best = (len(chain_nodes), logp, chain_nodes)
    return best[0], best[2]


def test_typical_acceptance_follows_the_published_rule():
    tree = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0))
    mask_tree = VerifyLayout(0, 0, 0, 0, choices_tree(tree)[0]).mask_tree()
    rng = np.random.default_rng(0)
    vocab, rows, agree_len = 6, 200, []
    logits = rng.normal(0, 2.5, (rows, len(mask_tree), vocab)).astype(np.float32)
    nodes = rng.integers(0, vocab, (rows, len(mask_tree) - 1)).astype(np.int32)
    candidates = np.ones((rows, 4), bool)
    for temperature in (0.7, 1.0):
        verdict = jax.jit(lambda l, n, k: typical_accept(mask_tree, n, l, jnp.asarray(candidates), k, temperature,
                                                         0.09, 0.3))(logits, nodes, jax.random.PRNGKey(1))
        for r in range(rows):
            length, chain_nodes = naive_typical(tree, logits[r], nodes[r], temperature, 0.09, 0.3)
            committed = int(np.asarray(verdict.commit[r]).sum())
            assert committed == length + 1, (r, length, committed)
            np.testing.assert_array_equal(np.asarray(verdict.tokens[r, :length]), nodes[r, chain_nodes])
            np.testing.assert_array_equal(np.asarray(verdict.path[r, :length]), np.asarray(chain_nodes) + 1)
            agree_len.append(length)
    assert min(agree_len) == 0 and max(agree_len) == 3  # the draws cover rejected roots and whole paths


def test_medusa_config_errors():
    with pytest.raises(ConfigError, match="set temperature = 0"):
        SamplerConfig.preset("medusa", temperature=0.7)
    with pytest.raises(ConfigError, match="at temperature 0 use acceptance='greedy'"):
        SamplerConfig.preset("medusa", acceptance="typical")
    with pytest.raises(ConfigError, match="no parent"):
        SamplerConfig.preset("medusa", choices=((0,), (1, 2)))


@pytest.mark.slow  # one more compiled loop; the rule itself is checked above by default
def test_typical_acceptance_decodes_at_a_temperature(shipped):
    model, _, ids, mask = shipped
    config = SamplerConfig.preset("medusa", gen_length=16, acceptance="typical", temperature=0.7)
    heads = jaxdllm.policy_params(SHIPPED, config)
    out = jaxdllm.generate(model, ids[:2], config, attention_mask=mask[:2], key=jax.random.PRNGKey(3),
                           policy_params=heads)
    assert (np.asarray(out.commit_step)[:, ids.shape[1]:] >= 1).all() and (np.asarray(out.nfe) < 16).all()


def test_heads_round_trip_beside_a_model_and_the_errors(tmp_path):
    heads = MedusaHeads(3, 8, 2)
    heads.kernel.set_value(jnp.arange(heads.kernel.get_value().size, dtype=jnp.float32).reshape(3, 2, 8, 8))
    save_heads(heads, tmp_path, model="tiny")
    assert heads_facts(tmp_path) == {"num_heads": 3, "embed_dim": 8, "layers": 2, "model": "tiny"}
    again = load_heads(tmp_path / HEADS_FILE)
    np.testing.assert_array_equal(np.asarray(again.kernel.get_value()), np.asarray(heads.kernel.get_value()))
    with pytest.raises(ConfigError, match="the tree needs 4 Medusa heads"):
        Medusa().load_params(tmp_path, None)
    with pytest.raises(CheckpointError, match="train them with a recipe of objective 'medusa'"):
        load_heads(tmp_path / "elsewhere")


def test_heads_beside_an_exported_model_are_not_weights(tmp_path):
    model = jaxdllm.from_pretrained(SHIPPED)
    out = save_pretrained(model, tmp_path / "copy")
    save_heads(load_heads(SHIPPED), out)
    again = jaxdllm.from_pretrained(out)  # the loader skips the side file
    assert again.config == model.config


def test_head_objective_at_init_is_the_model_two_tokens_ahead():
    """Zero-initialised heads are identities, so head k's logits are the model's own next-token
    logits and its loss is the model's cross-entropy k + 2 tokens ahead (computed here from the
    plain forward)."""
    from jaxdllm.data import BatchConfig, build_char_tokenizer, make_batch_iterator
    from jaxdllm.train.objectives import Views, make_objective
    from support.models import tiny_model

    model = tiny_model("tiny-qwen2", shared=True)
    objective = make_objective("medusa", {"num_heads": 2}, model.config)
    batch = next(make_batch_iterator(make_mixture(["copy", "reverse"], 8, 0), build_char_tokenizer(),
                                     BatchConfig(seq_len=32, batch_size=4, seed=0)))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    heads = objective.extra_module(model.config)

    @jax.jit
    def run(batch):
        forward = lambda t, p, m, cache=None, **kw: model(t, positions=p, attention=m, cache=cache, **kw)  # noqa: E731
        views = Views(student=lambda t, p, m: forward(t, p, m).logits, config=model.config, forward=forward,
                      init_cache=model.init_cache, unembed=model.unembed, extra=heads)
        return objective(views, batch, jax.random.PRNGKey(0))

    loss, metrics = run(batch)
    from jaxdllm.attention import MaskSpec

    seg = np.asarray(batch["segment_ids"])
    logits = np.asarray(jax.jit(lambda b: model(b["tokens"], positions=b["positions"], attention=MaskSpec(
        kind="causal", q_segment_ids=b["segment_ids"], kv_segment_ids=b["segment_ids"])).logits)(batch))
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    tokens, scored = np.asarray(batch["tokens"]), np.asarray(batch["target_mask"]).astype(bool)
    want = []
    for k in range(2):
        a = 2 + k
        where = scored[:, a:] & (seg[:, a:] == seg[:, :-a]) & (seg[:, :-a] > 0)
        ce = -np.take_along_axis(logp[:, :-a], tokens[:, a:, None], -1)[..., 0]
        want.append(ce[where].mean())
        np.testing.assert_allclose(float(metrics[f"head{k}_loss"]), want[k], rtol=1e-4)
    np.testing.assert_allclose(float(loss), want[0] + 0.8 * want[1], rtol=1e-4)
