"""Set Block Decoding (`sbd` presets: the masked canvas over a causal model with cache='set_block')
against the paper's procedure written here independently (Gat, Ben-Hamu et al. 2025, Algorithms
2-3, Fig. 10, the EB rule of Eq. 8): a transformers Qwen2 model, no cache, every forward over the
whole text so far followed by the block, under `allowed = (kv <= q) or (q >= t)` (t the block's
first position); the masked slots sorted by entropy, the largest s with
`sum_{j<=s} H - max_{j<=s} H <= gamma` committed at their argmax; a row stops once its EOS and
everything before it are decided.

Rows of 5, 9, 12 and 16 prompt tokens, alone and in one ragged (left-padded) batch; blocks of 8, two
of them; the tokens up to EOS and the forwards must equal the reference's. The LM head is scaled so
that entropies differ: some steps commit one token, some several (checked).
"""

import json

import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.data import make_split
from jaxdllm.shipped import checkpoint_dir
from support.hf_models import make_hf_model
from support.optional import torch, transformers
from support.sampler_fixtures import prompts

MASK, EOS = 126, 127
LENGTHS = [5, 9, 12, 16]
GEN, K = 16, 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa", seed=3, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS)
    with torch.no_grad():
        hf.lm_head.weight.mul_(100.0)   # entropies from ~0.2 to ~1 nats: one to four tokens per step
    path = tmp_path_factory.mktemp("sbd")
    hf.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "mask_token_id": MASK}))
    return jaxdllm.from_pretrained(path), hf


def reference(hf, prompt, gamma, mask=MASK, eos=EOS, gen=GEN, k=K):
    """`(answer tokens up to EOS, forwards, tokens committed per step)` of the paper's procedure."""
    MASK, EOS, K = mask, eos, k  # noqa: N806 (the paper's names)
    seq, answer, forwards, per_step = list(prompt), [], 0, []
    while len(answer) < gen:
        t, block = len(seq), [MASK] * K
        while MASK in block:
            n = t + K
            q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
            allowed = (kv <= q) | (q >= t)                                     # Fig. 10
            bias = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]
            with torch.no_grad():
                logits = hf(torch.tensor([seq + block]), attention_mask=bias,
                            position_ids=torch.arange(n)[None]).logits[0, t:].double()
            forwards += 1
            logits[:, MASK] = float("-inf")
            logp = torch.log_softmax(logits, -1)
            entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
            open_slots = sorted((i for i in range(K) if block[i] == MASK), key=lambda i: (float(entropy[i]), i))
            h = np.array([float(entropy[i]) for i in open_slots])
            s = int(((np.cumsum(h) - np.maximum.accumulate(h)) <= gamma).sum())   # EB, Eq. 8
            for i in open_slots[:s]:
                block[i] = int(logits[i].argmax())
            per_step.append(s)
            decided = answer + block
            first_eos = decided.index(EOS) if EOS in decided else None
            if first_eos is not None and MASK not in decided[:first_eos]:
                return decided[:first_eos + 1], forwards, per_step
        seq, answer = seq + block, answer + block
    return answer[:gen], forwards, per_step


def up_to_eos(tokens, eos=EOS):
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


# the default run: sbd-high on the random model (one-token and parallel steps) and sbd on the shipped one
@pytest.mark.parametrize("preset,gamma", [pytest.param("sbd", 0.1, marks=pytest.mark.slow), ("sbd-high", 0.35)])
def test_sbd_equals_the_papers_procedure_alone_and_in_a_ragged_batch(checkpoint, preset, gamma):
    model, hf = checkpoint
    config = SamplerConfig.preset(preset, gen_length=GEN, block_length=K)
    assert config.entropy_bound == gamma
    ids, mask, rows = prompts(LENGTHS, seed=4, vocab=120)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    steps = []
    for r, row in enumerate(rows):
        want, forwards, per_step = reference(hf, row, gamma)
        steps += per_step
        alone = jaxdllm.generate(model, np.asarray(row)[None], config)
        assert up_to_eos(alone.generated[0]) == want, r
        assert int(alone.nfe[0]) == forwards, r
        assert up_to_eos(batch.generated[r]) == want, r
        assert int(batch.nfe[r]) == forwards, r
    if preset == "sbd-high":
        assert min(steps) == 1 and max(steps) > 1   # one-token and parallel steps both checked


def test_next_token_decoding_of_the_same_model_stays_exact(checkpoint):
    """The SBD checkpoint is a plain causal model: `jacobi` decodes transformers' greedy tokens."""
    model, hf = checkpoint
    ids, _, rows = prompts([9], seed=4, vocab=120)
    out = jaxdllm.generate(model, ids, SamplerConfig.preset("jacobi", gen_length=GEN, window=4))
    with torch.no_grad():
        greedy = hf.generate(torch.tensor(ids, dtype=torch.long), max_new_tokens=GEN, do_sample=False,
                             eos_token_id=None)[0, len(rows[0]):]
    assert [int(t) for t in out.generated[0]] == greedy.tolist()


def test_set_block_cache_refuses_short_prompt_padding(checkpoint):
    model, _ = checkpoint
    config = SamplerConfig.preset("sbd", gen_length=GEN, block_length=K, prompt_bucket=4)
    with pytest.raises(ValueError, match="prompt_bucket >= 8"):
        jaxdllm.generate(model, np.ones((1, 3), np.int32), config)


SHIPPED = checkpoint_dir("tasks-qwen2-small-sbd")


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped SBD checkpoint")
def test_the_shipped_sbd_model_decodes_as_the_papers_procedure():
    """The shipped Set Block Decoding model (trained tokens: several per forward, EOS, varied digits),
    `sbd` with blocks of 16 on held-out prompts of four tasks in one ragged batch, against the
    reference run with transformers' Qwen2 on the same checkpoint."""
    model, tok, _ = jaxdllm.load(SHIPPED)
    hf = transformers.Qwen2ForCausalLM.from_pretrained(SHIPPED, attn_implementation="eager").eval()
    examples = [make_split(task, 1, 7, split="test")[0] for task in ("copy_long", "sort", "reverse_long", "perm")]
    rows = [tok.encode(e.prompt) for e in examples]
    config = SamplerConfig.preset("sbd", gen_length=32)
    batch = tok([e.prompt for e in examples])
    out = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)
    mask_id, eos = model.config.mask_token_id, model.config.eos_token_id
    steps = []
    for r, row in enumerate(rows):
        want, forwards, per_step = reference(hf, row, config.entropy_bound, mask=mask_id, eos=eos, gen=32, k=16)
        steps += per_step
        assert up_to_eos(out.generated[r], eos) == want, r
        assert int(out.nfe[r]) == forwards, r
    assert max(steps) >= 4 and len(set(sum((up_to_eos(g, eos) for g in out.generated), []))) >= 8
