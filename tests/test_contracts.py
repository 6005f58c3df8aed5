"""Contract tests over the registries: every cache, training objective, data source and attention
backend jaxdllm registers passes the same checks, so a new one is tested the day it is registered
(decoding policies: `test_every_policy_fills_the_canvas_and_counts` in test_sampler.py).

What a piece needs beyond the shared setup (another model, settings, an input file) comes from the
table next to its test; a registered piece without an entry fails the test, naming the table.
"""

import functools
import json

import jax
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.attention import MaskSpec, attend
from jaxdllm.attention.reference import reference_attention
from jaxdllm.data import BATCH_KEYS, BatchConfig, BatchIterator, SpecialIds, build_char_tokenizer
from jaxdllm.data import make_batch_iterator, make_mixture, special_token_ids
from jaxdllm.train import TrainConfig, setup
from jaxdllm.train.distill.trajectories import pack
from jaxdllm.train.objectives import Views, make_objective
from support import registries
from support.models import tiny_model, two_layer_diffusiongemma
from support.sampler_fixtures import prompts, shared_tiny_llada


def _entry(table: dict, name: str, what: str, table_name: str):
    if name not in table:
        pytest.fail(f"{what} {name!r} is registered but has no entry in {table_name} (tests/test_contracts.py): "
                    "add one ({} if the shared setup suffices)")
    return table[name]


# -- caches: exact where they claim to be, and always a complete canvas --------------------------------

# "model": which shared model the cache runs on; "exact": the settings under which it must give the
# tokens and forward counts of `cache="none"` (Fast-dLLM's caches: refreshed at every step).
CACHE_SETUP = {
    "none": {"model": "bidirectional", "exact": {}},
    "prefix": {"model": "bidirectional", "exact": {"cache_refresh_every_step": True}},
    "dual": {"model": "bidirectional", "exact": {"cache_refresh_every_step": True}},
    "block": {"model": "block_causal", "exact": {}},
    # a causal model's Set Block Decoding: no other cache decodes it; its exactness (tokens and forwards
    # equal to the paper's procedure run without a cache) is tests/decoding/test_set_block_decoding.py's
    "set_block": {"model": "causal", "exact": None},
}


def _decoding_model(kind: str):
    if kind == "block_causal":  # the model of test_sampler_block_cache.py: peaked logits, blocks of 8
        return tiny_model("tiny-block-diffusion", head_scale=60.0, shared=True)
    if kind == "causal":
        return tiny_model("tiny-qwen2", head_scale=60.0, shared=True, mask_token_id=253)
    return shared_tiny_llada()[0]


_sampler = functools.partial(SamplerConfig, gen_length=16, block_length=8, steps=8, prompt_bucket=8)


@pytest.mark.parametrize("policy", ["threshold", "llada"])
@pytest.mark.parametrize("cache", registries.caches())
def test_every_cache_is_exact_where_it_claims_and_fills_the_canvas(cache, policy):
    entry = _entry(CACHE_SETUP, cache, "cache", "CACHE_SETUP")
    model = _decoding_model(entry["model"])
    ids, mask, _ = prompts([4, 6], seed=2)
    if entry["exact"] is not None:
        exact = jaxdllm.generate(model, ids, _sampler(policy=policy), attention_mask=mask)
        cached = jaxdllm.generate(model, ids, _sampler(policy=policy, cache=cache, **entry["exact"]),
                                  attention_mask=mask)
        np.testing.assert_array_equal(np.asarray(cached.tokens), np.asarray(exact.tokens))
        np.testing.assert_array_equal(np.asarray(cached.nfe), np.asarray(exact.nfe))
    approx = jaxdllm.generate(model, ids, _sampler(policy=policy, cache=cache), attention_mask=mask)
    steps, width = np.asarray(approx.commit_step), ids.shape[1]
    assert not (np.asarray(approx.tokens) == model.config.mask_token_id).any()  # approximate, but complete
    assert (steps[:, width:] >= 1).all()
    last = steps.max(1)  # a block-causal row's last block may run past gen_length: those forwards are not shown
    assert (last == approx.nfe).all() if entry["model"] != "block_causal" else (last <= approx.nfe).all()


# -- training objectives: one step gives a finite loss and moves the parameters ------------------------

TASKS = ("copy", "reverse", "sort", "add")
EOS, PAD = 254, 0  # tiny-qwen2's EOS; trajectory rows are padded with 0 (as in test_jacobi_forcing.py)

# "preset" (+ "overrides"): the model it trains; "batch": "tasks" (tokenised task examples) or
# "trajectories" (packed Jacobi rows); "settings": its [objective] settings.
OBJECTIVE_SETUP = {
    "mdm_pretrain": {"preset": "tiny-llada", "batch": "tasks"},
    "mdm_sft": {"preset": "tiny-llada", "batch": "tasks"},
    "block_diffusion": {"preset": "tiny-block-diffusion", "batch": "tasks"},
    "causal_lm": {"preset": "tiny-qwen2", "batch": "tasks"},
    "certainty_forcing": {"preset": "tiny-llada", "batch": "tasks"},
    "jacobi_forcing": {"preset": "tiny-qwen2", "overrides": {"pad_token_id": PAD}, "batch": "trajectories",
                       "settings": {"block_length": 4}},
    "cllm": {"preset": "tiny-qwen2", "overrides": {"pad_token_id": PAD}, "batch": "trajectories",
             "settings": {"block_length": 4}},
    "uniform_block_diffusion": {"preset": "tiny-diffusiongemma", "batch": "tasks", "model": two_layer_diffusiongemma},
    "medusa": {"preset": "tiny-qwen2", "batch": "tasks", "settings": {"num_heads": 2, "train_backbone": True}},
    "sdar": {"preset": "tiny-sdar", "batch": "tasks"},
    "set_block": {"preset": "tiny-qwen2", "overrides": {"mask_token_id": 253}, "batch": "tasks",
                  "settings": {"min_block": 2, "max_block": 3}},
    "assd": {"preset": "tiny-xlnet", "batch": "tasks", "settings": {"infill_rate": 0.5}},
    "wedlm": {"preset": "tiny-wedlm", "batch": "tasks", "settings": {"block_size": 8}},
    "multiverse": {"preset": "tiny-qwen2", "batch": "tasks"},  # tag-free rows: the causal reduction
    "mdlm": {"preset": "tiny-llada", "batch": "tasks"},
}


def _task_batch():
    it = make_batch_iterator(make_mixture(TASKS, 20, 0), build_char_tokenizer(),
                             BatchConfig(seq_len=32, batch_size=4, seed=0))
    return next(it)


def _trajectory_batch(n=4):
    """Two packed `prompt, noisy_0, clean_0, ...` rows (Jacobi Forcing's layout)."""
    rng = np.random.default_rng(0)
    examples = []
    for p, blocks in ((5, 2), (3, 3)):
        clean = rng.integers(4, 200, (blocks, n))
        noisy = clean.copy()
        noisy[:, n // 2:] = rng.integers(4, 200, (blocks, n - n // 2))
        examples.append(pack(rng.integers(4, 200, p), noisy, clean))
    config = BatchConfig(seq_len=28, batch_size=2, shuffle=False, fill_with_eos=False)
    return next(BatchIterator(examples, config, SpecialIds(pad=PAD, bos=None, eos=EOS)))


@pytest.mark.parametrize("kind", registries.objectives())
def test_every_objective_trains_one_step(kind):
    entry = _entry(OBJECTIVE_SETUP, kind, "objective", "OBJECTIVE_SETUP")
    model = (entry["model"]() if "model" in entry else  # read only: steps are functional
             tiny_model(entry["preset"], shared=True, **entry.get("overrides", {})))
    objective = make_objective(kind, entry.get("settings", {}), model.config)
    batch = {k: np.asarray(v) for k, v in (_task_batch() if entry["batch"] == "tasks" else _trajectory_batch()).items()}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    extra = objective.extra_module(model.config)  # an objective's own module (Medusa heads) trains with it
    params = {"model": params, "extra": None if extra is None else nnx.state(extra, nnx.Param)}
    extra_def = None if extra is None else nnx.graphdef(extra)

    @jax.jit
    def step(params, batch, key):
        def loss_of(params):
            net = nnx.merge(graphdef, params["model"], rest)
            forward = lambda t, p, m, cache=None, **kw: net(t, positions=p, attention=m, cache=cache, **kw)  # noqa: E731
            views = Views(student=lambda t, p, m: forward(t, p, m).logits, config=net.config, forward=forward,
                          init_cache=net.init_cache, unembed=net.unembed,
                          extra=None if extra_def is None else nnx.merge(extra_def, params["extra"]))
            return objective(views, batch, key)[0]

        loss, grads = jax.value_and_grad(loss_of)(params)
        return loss, grads, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    loss, grads, updated = step(params, batch, jax.random.PRNGKey(0))
    grads, before, after = (jax.tree.leaves(t) for t in (grads, params, updated))
    assert np.isfinite(float(loss)) and float(loss) > 0, (kind, loss)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads), kind
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(before, after)), kind


# -- data sources: a recipe's batches have the trainer's keys and shapes --------------------------------

def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _gsm8k_dir(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", [{"question": f"{i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
                                          for i in range(8)])
    return str(folder)


def _trajectories_file(tmp_path):
    tok = build_char_tokenizer()
    ids = special_token_ids(tok)
    rows = []
    for i in range(8):
        prompt = tok.encode(f"copy {i}{i + 1}=", add_special_tokens=False)
        fixed = tok.encode(f"{i}{i + 1}", add_special_tokens=False) + [ids["eos_token_id"]] * 6
        states = [fixed[:2] + [ids["mask_token_id"]] * 6, fixed]
        rows.append({"prompt_ids": prompt, "states": states, "fixed_point": fixed, "correct": True})
    return _write_jsonl(tmp_path / "trajectories.jsonl", rows)


# The recipe sections each source needs beyond the shared ones, from a scratch folder.
DATA_SETUP = {
    "tasks": lambda tmp: {"data": {"tasks": ["copy", "reverse"]}},
    "gsm8k": lambda tmp: {"data": {"path": _gsm8k_dir(tmp), "split": "train"}},
    "jsonl": lambda tmp: {"data": {"path": _write_jsonl(tmp / "rows.jsonl", [
        {"prompt": f"copy {i}=", "response": str(i)} for i in range(8)])}},
    "teacher": lambda tmp: {"data": {"path": _write_jsonl(tmp / "answers.jsonl", [
        {"prompt": f"copy {i}=", "answer": str(i), "correct": True} for i in range(8)])}},
    "trajectories": lambda tmp: {"model": {"preset": "tiny-qwen2"}, "data": {"path": _trajectories_file(tmp)},
                                 "objective": {"kind": "jacobi_forcing", "block_length": 4}},
    # the character tokenizer spells the tags out: the Multiverse rows are too long for 48 and skipped
    "multiverse_curriculum": lambda tmp: {"data": {"tasks": ["parts_small"], "on_too_long": "skip"}},
    "sequential_curriculum": lambda tmp: {"data": {"tasks": ["parts_small"]}},
    "safe_molecules": lambda tmp: _safe_folder(tmp),
}


def _safe_folder(tmp):
    """A prepared molecule folder of four SAFE strings and its tokenizer (no RDKit needed to read it)."""
    from jaxdllm.molecules.moses import write_pairs
    from jaxdllm.molecules.safe_tokenizer import build_safe_tokenizer, save_safe_tokenizer

    pairs = [("CC(C)Cc1ccc(C(C)C(=O)O)cc1", "c12ccc3cc1.C3(C)C(=O)O.CC(C)C2"), ("c1ccccc1", "c1ccccc1"),
             ("CCOC(=O)c1ccccc1", "c13ccccc1.C23=O.O2CC"), ("OCCc1ccccc1", "c1ccccc1C2.C2O")]
    write_pairs(tmp / "train.tsv.gz", pairs)
    save_safe_tokenizer(build_safe_tokenizer(s for _, s in pairs), tmp / "tokenizer")
    return {"model": {"tokenizer": str(tmp / "tokenizer")}, "data": {"path": str(tmp)}, "objective": {"kind": "mdlm"}}


@pytest.mark.parametrize("source", registries.data_sources())
def test_every_data_source_yields_batches_of_the_recipe_shape(source, tmp_path):
    sections = _entry(DATA_SETUP, source, "data source", "DATA_SETUP")(tmp_path)
    raw = {"model": {"preset": "tiny-llada"}, "objective": {"kind": "mdm_sft"}, "mesh": {"data": 1},
           "data": {"source": source, "seq_len": 48, "batch_size": 4, "examples_per_task": 8}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    config = TrainConfig.from_dict(raw)
    tokenizer = setup.load_tokenizer(config)
    objective = make_objective(config.objective.kind, config.objective.settings)
    batch = next(setup.make_batches(config, tokenizer, objective))
    assert set(BATCH_KEYS) <= set(batch), (source, sorted(batch))
    for key in BATCH_KEYS:
        assert np.asarray(batch[key]).shape == (4, 48), (source, key, np.asarray(batch[key]).shape)
    tokens, targets = np.asarray(batch["tokens"]), np.asarray(batch["target_mask"])
    assert ((tokens >= 0) & (tokens < tokenizer.vocab_size)).all() and targets.any(), source


# -- attention backends: the reference's output on a small random mask ----------------------------------

def _random_mask_case():
    """q `[2, 128, 4, 32]`, k `[2, 160, 2, 32]`, a block-diffusion mask with random segments (the
    second row starts with padding) and queries offset into the keys."""
    rng = np.random.default_rng(0)
    q = jax.numpy.asarray(rng.standard_normal((2, 128, 4, 32)), jax.numpy.float32)
    k = jax.numpy.asarray(rng.standard_normal((2, 160, 2, 32)), jax.numpy.float32)
    seg = np.sort(rng.integers(1, 4, (2, 160)), axis=1)
    seg[1, :37] = 0
    seg = jax.numpy.asarray(seg, jax.numpy.int32)
    mask = MaskSpec(kind="block_diffusion", block_size=32, q_offset=32, q_segment_ids=seg[:, 32:], kv_segment_ids=seg)
    return q, k, mask


@pytest.mark.parametrize("impl", registries.attention_backends())
def test_every_attention_backend_agrees_with_the_reference(impl):
    options = registries.backend_options(impl)
    q, k, mask = _random_mask_case()
    want = reference_attention(q, k, k, mask)
    got = jax.jit(lambda q, k: attend(q, k, k, mask, impl=impl, **options))(q, k)
    assert got.shape == want.shape and float(jax.numpy.abs(got - want).max()) < 1e-5, impl
