"""LLaDA2 (MoE block diffusion): logits and routing against a torch forward written from the published
modeling code (tests/support/llada2_reference.py), grouped matmuls against a dense all-experts mix, checkpoint
round trips, an 8-device load with experts sharded, and the compiled loop with the `llada2` preset."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import jaxdllm
from flax import nnx

from jaxdllm import ModelConfig, RunOptions, SamplerConfig, Transformer, generate, sharding
from jaxdllm.models import ExpertConfig
from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.models.moe import grouped_swiglu, route
from support.forward import forward as fwd
from support.llada2_reference import (TINY, _route, block_causal_mask, llada2_forward, make_llada2_checkpoint,
                                     published_generate)
from support.optional import torch

TOL = 1e-4  # the fp32 parity tolerance of tests/checkpoint/test_hf_parity.py
VARIANTS = {
    "published": {},
    "biases": dict(use_qkv_bias=True, use_bias=True),
    "one-expert-no-shared": dict(num_experts_per_tok=1, num_shared_experts=0),
    "tied-all-moe-full-rope": dict(tie_word_embeddings=True, first_k_dense_replace=0, partial_rotary_factor=1.0),
}


# The default run covers the published config and the bias options; the slow run every variant.
DEFAULT_VARIANTS = ("published", "biases")


@pytest.fixture(scope="module", params=[v if v in DEFAULT_VARIANTS else pytest.param(v, marks=pytest.mark.slow)
                                        for v in VARIANTS])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"llada2_{request.param}")
    overrides = VARIANTS[request.param]
    return path, make_llada2_checkpoint(path, **overrides), dict(TINY, **overrides)


def _ids(length=24, batch=2, seed=0):
    return np.random.RandomState(seed).randint(0, TINY["vocab_size"], (batch, length))


def _routing_loads(routing, num_experts):
    return np.stack([np.bincount(r["experts"].reshape(-1).numpy(), minlength=num_experts) for r in routing])


def test_config_json_reads_as_the_published_architecture(checkpoint):
    path, _, cfg = checkpoint
    c = jaxdllm.from_pretrained(path).config
    e = c.experts
    assert (e.num_experts, e.experts_per_token, e.expert_groups, e.top_groups) == (16, cfg["num_experts_per_tok"], 4, 2)
    assert (c.attention, c.block_size, c.shift_logits, c.qk_norm) == ("block_causal", 32, False, True)
    assert c.rope_dim == int(16 * cfg["partial_rotary_factor"])
    assert e.first_dense_layers == cfg["first_k_dense_replace"]


@pytest.mark.parametrize("block", [8, None], ids=["block-causal", "bidirectional"])
def test_fp32_logits_and_routing_match_torch(checkpoint, block):
    path, weights, cfg = checkpoint
    model = jaxdllm.from_pretrained(path)
    ids = _ids()
    mask = None if block is None else block_causal_mask(ids.shape[1], block)
    spec = MaskSpec(kind="bidirectional") if block is None else MaskSpec(kind="block_causal", block_size=block)
    want, routing = llada2_forward(weights, cfg, torch.as_tensor(ids), mask=mask)
    out = nnx.jit(lambda m, x: m(x, attention=spec, return_router_loads=True))(model, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(out.logits), want.numpy(), atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(out.router_loads), _routing_loads(routing, 16))  # every layer and expert


def test_router_picks_the_same_experts_and_weights_as_torch():
    c = ModelConfig.preset("tiny-llada2", embed_dim=48)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 48, generator=g)
    w = {"gate.weight": torch.randn(16, 48, generator=g) * 0.3, "gate.expert_bias": torch.randn(16, generator=g) * 0.05}
    cfg = dict(num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    want_idx, want_w = _route(x, w, "", cfg)
    idx, weights = route(jnp.asarray(x.numpy()), jnp.asarray(w["gate.weight"].numpy().T),
                         jnp.asarray(w["gate.expert_bias"].numpy()), c.experts)
    np.testing.assert_array_equal(np.asarray(idx), want_idx.numpy())  # same experts, same order (best first)
    np.testing.assert_allclose(np.asarray(weights), want_w.numpy(), atol=1e-6)
    assert (np.asarray(weights).sum(-1) == pytest.approx(2.5, abs=1e-5))


def test_router_ties_go_to_the_lower_index():
    """Equal scores: groups and experts with lower indices win (`jax.lax.top_k`). torch's CPU top-k
    breaks such ties by its selection algorithm (8 equal scores give [6, 5, 4]), not by a rule."""
    c = ModelConfig.preset("tiny-llada2").experts
    x = jnp.ones((3, 64))
    idx, weights = route(x, jnp.zeros((64, 16)), jnp.zeros((16,)), c)
    np.testing.assert_array_equal(np.asarray(idx), [[0, 1, 2, 3]] * 3)  # groups 0 and 1, their first experts
    np.testing.assert_allclose(np.asarray(weights), 2.5 / 4)
    bias = jnp.zeros((16,)).at[jnp.array([13, 14])].set(1.0)  # group 3 now scores highest
    idx, _ = route(x, jnp.zeros((64, 16)), bias, c)
    np.testing.assert_array_equal(np.asarray(idx), [[13, 14, 0, 1]] * 3)


def test_grouped_matmuls_equal_a_dense_mix_of_all_experts():
    rng = np.random.default_rng(0)
    t, k, e, d, m = 40, 3, 8, 12, 10
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    experts = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]), jnp.int32)
    weights = jnp.asarray(rng.random((t, k)), jnp.float32)
    gate, up, down = (jnp.asarray(rng.standard_normal(s) * 0.3, jnp.float32) for s in [(e, d, m), (e, d, m), (e, m, d)])
    y, load = grouped_swiglu(x, experts, weights, gate, up, down)
    all_out = jnp.einsum("tem,emd->ted", jax.nn.silu(jnp.einsum("td,edm->tem", x, gate)) * jnp.einsum("td,edm->tem", x, up), down)
    one_hot = jnp.zeros((t, e)).at[jnp.arange(t)[:, None], experts].add(weights)  # dense routing matrix
    np.testing.assert_allclose(np.asarray(y), np.asarray(jnp.einsum("ted,te->td", all_out, one_hot)), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(load), np.bincount(np.asarray(experts).reshape(-1), minlength=e))


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_bf16_checkpoint_matches_torch_in_bf16(tmp_path):
    """bf16: logits of the positions whose routing agrees stay within bf16 noise; a few tokens may
    route differently in bf16 (the router's inputs differ in their last bits)."""
    weights = make_llada2_checkpoint(tmp_path, dtype=torch.bfloat16)
    model = jaxdllm.from_pretrained(tmp_path)
    assert model.options.param_dtype == "bfloat16"
    ids = _ids(length=32, batch=2)
    want, routing = llada2_forward(weights, TINY, torch.as_tensor(ids), mask=block_causal_mask(32, 8),
                                   dtype=torch.bfloat16)
    out = model(jnp.asarray(ids), attention=MaskSpec(kind="block_causal", block_size=8), return_router_loads=True)
    logits, loads = out.logits, out.router_loads
    diff = np.abs(np.asarray(logits) - want.numpy()).max(-1)  # [B, L]
    assert np.mean(diff < 0.06) >= 0.9, diff
    assert np.mean(np.asarray(logits).argmax(-1) == want.numpy().argmax(-1)) >= 0.95
    moved = np.abs(np.asarray(loads) - _routing_loads(routing, 16)).sum()
    assert moved <= 0.1 * np.asarray(loads).sum()  # at most 5 % of assignments move (each move counts twice)


def test_round_trip_is_bit_identical_with_fused_qkv_split_across_files(tmp_path):
    make_llada2_checkpoint(tmp_path / "hf", use_qkv_bias=True, use_bias=True)
    model = jaxdllm.from_pretrained(tmp_path / "hf")
    jaxdllm.save_pretrained(model, tmp_path / "one")
    jaxdllm.save_pretrained(model, tmp_path / "many", max_shard_size="20KB")
    original = load_file(str(tmp_path / "hf/model.safetensors"))
    for out in ("one", "many"):
        files = sorted((tmp_path / out).glob("*.safetensors"))
        written = {k: v for f in files for k, v in load_file(str(f)).items()}
        assert sorted(written) == sorted(original)
        for name, value in original.items():
            np.testing.assert_array_equal(written[name], value, err_msg=name)
    assert len(list((tmp_path / "many").glob("*.safetensors"))) > 3
    again = jaxdllm.from_pretrained(tmp_path / "many")
    ids = jnp.asarray(_ids())
    np.testing.assert_array_equal(np.asarray(fwd(again, ids).logits), np.asarray(fwd(model, ids).logits))
    config = json.loads((tmp_path / "many/config.json").read_text())
    assert config["model_type"] == "llada2_moe" and config["num_experts"] == 16 and config["n_group"] == 4


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_scan_layers_and_int8_load_the_same_checkpoint(tmp_path):
    make_llada2_checkpoint(tmp_path, first_k_dense_replace=0)  # identical layers: scan can stack them
    plain = jaxdllm.from_pretrained(tmp_path)
    scanned = jaxdllm.from_pretrained(tmp_path, scan_layers=True)
    ids = jnp.asarray(_ids())
    np.testing.assert_allclose(np.asarray(fwd(scanned, ids).logits), np.asarray(fwd(plain, ids).logits), atol=1e-5)
    jaxdllm.save_pretrained(scanned, tmp_path / "back")
    np.testing.assert_array_equal(load_file(str(tmp_path / "back/model.safetensors"))["model.layers.1.mlp.experts.7.up_proj.weight"],
                                  load_file(str(tmp_path / "model.safetensors"))["model.layers.1.mlp.experts.7.up_proj.weight"])
    int8 = jaxdllm.from_pretrained(tmp_path, quantization="int8")
    assert int8.layers[1].mlp.gate.kernel[...].dtype == jnp.int8
    assert int8.layers[1].mlp.gate.kernel_scale[...].shape == (16, 1, 32)  # per expert, per output channel
    agree = np.mean(np.asarray(fwd(int8, ids).logits).argmax(-1) == np.asarray(fwd(plain, ids).logits).argmax(-1))
    assert agree >= 0.9


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
@pytest.mark.mesh
def test_sharded_load_puts_whole_experts_on_each_fsdp_shard(tmp_path):
    weights = make_llada2_checkpoint(tmp_path)
    mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
    model = jaxdllm.from_pretrained(tmp_path, mesh=mesh)
    kernel = model.layers[1].mlp.gate.kernel[...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", None, "tensor")
    assert {s.data.shape for s in kernel.addressable_shards} == {(4, 64, 16)}  # 16 experts / 4, width 32 / 2
    ids = _ids()
    want, _ = llada2_forward(weights, TINY, torch.as_tensor(ids), mask=block_causal_mask(24, 32))
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids)).logits), want.numpy(), atol=TOL)
    forward = jax.jit(lambda m, x: m(x).logits)
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(ids))), want.numpy(), atol=TOL)
    # Experts stay where they are: XLA moves the step's tokens to the experts (gathers activations,
    # sums expert outputs), never an expert kernel to the tokens.
    hlo = forward.lower(model, jnp.asarray(ids)).compile().as_text()
    gathered = re.findall(r"= \w+\[([\d,]+)\][^=]*? all-gather\(", hlo)
    assert gathered, "expected the token and attention-weight gathers of an fsdp mesh"
    assert not [g for g in gathered if g.split(",")[0] == "16" and len(g.split(",")) == 3], gathered


def test_moe_config_errors_say_what_to_change():
    with pytest.raises(ConfigError, match="multiple of expert_groups"):
        ModelConfig.preset("tiny-llada2", experts=dict(num_experts=15))
    with pytest.raises(ConfigError, match="top_groups"):
        ModelConfig.preset("tiny-llada2", experts=dict(top_groups=5))
    with pytest.raises(ConfigError, match="exceeds the experts"):
        ModelConfig.preset("tiny-llada2", experts=dict(experts_per_token=9))
    with pytest.raises(ConfigError, match=r"first_dense_layers must be in \[0, num_layers=3\], got 4"):
        ModelConfig.preset("tiny-llada2", experts=dict(first_dense_layers=4))
    with pytest.raises(ConfigError, match="scan_layers"):
        nnx.eval_shape(lambda: Transformer(ModelConfig.preset("tiny-llada2"), RunOptions(scan_layers=True),
                                           rngs=nnx.Rngs(0)))
    with pytest.raises(ConfigError, match="rotary_fraction"):
        ModelConfig.preset("tiny-llada2", rotary_fraction=0.1)


@pytest.mark.parametrize("settings, message", [
    (dict(num_experts=15, expert_groups=4), r"num_experts \(15\) must be a multiple of expert_groups \(4\)"),
    (dict(expert_groups=4, top_groups=5), r"top_groups \(5\) cannot exceed expert_groups \(4\)"),
    (dict(num_experts=4, experts_per_token=1, expert_groups=4), "num_experts / expert_groups must be >= 2"),
    (dict(experts_per_token=9, expert_groups=4, top_groups=2), r"experts_per_token \(9\) exceeds the experts"),
    (dict(num_experts=0), "num_experts must be a positive integer, got 0"),
    (dict(expert_dim=-1), "expert_dim must be a positive integer"),
    (dict(first_dense_layers=-1), "first_dense_layers must be >= 0"),
    (dict(num_shared_experts=-1), "num_shared_experts must be >= 0"),
    (dict(routed_scaling=0.0), "routed_scaling must be > 0"),
    (dict(experts_per_token="4"), r"experts.experts_per_token must be an integer, got '4'"),
])
def test_expert_config_errors_say_what_to_change(settings, message):
    with pytest.raises(ConfigError, match=message):
        ExpertConfig(**{**dict(num_experts=16, experts_per_token=4, expert_dim=32), **settings})


def test_expert_settings_change_a_preset_and_num_experts_0_is_dense():
    base = ModelConfig.preset("tiny-llada2")
    fewer = ModelConfig.preset("tiny-llada2", experts=dict(num_experts=8))  # a table changes only what it names
    assert fewer.experts == dataclasses.replace(base.experts, num_experts=8)
    assert ModelConfig.preset("tiny-llada2", experts=fewer.experts) == fewer
    dense = ModelConfig.preset("tiny-llada2", experts=dict(num_experts=0))
    assert dense.experts is None and dense.num_moe_layers == 0 and dense.num_params == dense.active_params
    assert ModelConfig.preset("tiny-llada2", experts=None) == dense
    with pytest.raises(ConfigError, match=r"need \['experts_per_token', 'expert_dim'\]"):
        ModelConfig.preset("tiny-llada", experts=dict(num_experts=8))  # a dense preset: no settings to keep
    with pytest.raises(ConfigError, match=r"unknown expert setting\(s\) \['n_group'\]"):
        ModelConfig.preset("tiny-llada2", experts=dict(n_group=2))


def test_published_sizes():
    mini, flash = ModelConfig.preset("llada2-mini"), ModelConfig.preset("llada2-flash")
    assert 16.0e9 < mini.num_params < 16.5e9 and 1.3e9 < mini.active_params < 1.5e9
    assert 100e9 < flash.num_params < 105e9 and 5.9e9 < flash.active_params < 6.3e9


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_llada2_preset_runs_the_compiled_loop(tmp_path):
    """The `llada2` preset on a tiny LLaDA2 checkpoint: one compiled loop; each row equals decoding it
    alone (padding included); ragged prompt lists get an error saying how to pad."""
    make_llada2_checkpoint(tmp_path)
    model = jaxdllm.from_pretrained(tmp_path)
    config = SamplerConfig.preset("llada2", gen_length=64)
    assert (config.block_length, config.policy.name, config.threshold, config.stop_at_eos) == (
        32, "threshold", 0.95, "block")
    with pytest.raises(jaxdllm.errors.InputError, match="differ in length"):
        generate(model, [[5, 6, 7, 8, 9], [10, 11, 12]], config)
    prompts = np.array([[5, 6, 7, 8, 9], [0, 0, 10, 11, 12]])
    batch = generate(model, prompts, config, attention_mask=np.array([[1] * 5, [0, 0, 1, 1, 1]]))
    for row, prompt in enumerate([[5, 6, 7, 8, 9], [10, 11, 12]]):
        alone = generate(model, [prompt], config)
        np.testing.assert_array_equal(batch.generated[row], alone.generated[0])
        assert 1 <= int(batch.nfe[row]) == int(alone.nfe[0]) <= 64 + 32 - len(prompt)  # to the end of its last block
    assert batch.generated.shape == (2, 64)
    cached = generate(model, prompts, config.replace(cache="block"), attention_mask=np.array([[1] * 5, [0, 0, 1, 1, 1]]))
    np.testing.assert_array_equal(cached.generated, batch.generated)  # the block cache is exact here
    np.testing.assert_array_equal(cached.nfe, batch.nfe)


@pytest.mark.parametrize("scale,threshold,editing_threshold,max_post_steps",
                         [pytest.param(6, 0.5, 0.3, 16, marks=pytest.mark.slow),  # the default run's 6-minute budget
                          pytest.param(10, 0.7, 0.5, 4, marks=pytest.mark.slow)])
def test_token_editing_equals_the_published_loop(tmp_path, scale, threshold, editing_threshold, max_post_steps):
    """LLaDA2.1's `token_editing` policy in the compiled loop against the published loop (torch model,
    torch loop), on a checkpoint whose LM head is scaled so that tokens get committed, then edited:
    same tokens and same forwards, for each row of a batch of whole-block prompts and blocks of 32."""
    weights = make_llada2_checkpoint(tmp_path, head_scale=scale)  # confident predictions: commits and edits
    model = jaxdllm.from_pretrained(tmp_path)
    config = SamplerConfig(gen_length=64, block_length=32, policy="token_editing", threshold=threshold,
                           editing_threshold=editing_threshold, max_post_steps=max_post_steps,
                           stop_at_eos="block")
    prompts = np.random.RandomState(1).randint(0, 150, (2, 32))  # whole blocks: no padding
    out = generate(model, prompts, config)
    for row, prompt in enumerate(prompts):
        stats = {}
        tokens, forwards = published_generate(weights, dict(TINY), prompt, 64, 32, threshold, editing_threshold,
                                              max_post_steps, stats=stats)
        assert stats["edits"] > 0  # the comparison covers edits
        assert [int(t) for t in out.generated[row]][:len(tokens)] == tokens
        assert int(out.nfe[row]) == forwards


def test_llada2_1_preset_holds_the_published_settings():
    config = SamplerConfig.preset("llada2.1")
    assert (config.policy.name, config.threshold, config.editing_threshold, config.max_post_steps) == (
        "token_editing", 0.95, 0.9, 16)
    assert config.block_length == 32 and config.stop_at_eos == "block"
    with pytest.raises(ConfigError, match="max_post_steps"):
        SamplerConfig.preset("llada2.1", max_post_steps=-1)


def test_a_bidirectional_llada2_layout_model_keeps_its_attention_through_export(tmp_path):
    from flax import nnx

    config = ModelConfig.preset("tiny-llada2", attention="bidirectional", block_size=None)
    model = jaxdllm.Transformer(config, rngs=nnx.Rngs(0))
    jaxdllm.save_pretrained(model, tmp_path)
    back = jaxdllm.from_pretrained(tmp_path)
    assert back.config.attention == "bidirectional"
    assert jaxdllm.from_pretrained(tmp_path, attention="block_causal", block_size=8).config.block_size == 8


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_expert_bias_moves_towards_balance_and_nothing_else_moves_it():
    """Aux-loss-free balancing in the trainer: after each step every router's bias moves by exactly
    +-rate (or 0) per expert, against that step's load: the optimizer (AdamW with weight decay)
    never touches it. The logged load metrics describe the step's routing."""
    from jaxdllm.sharding import make_mesh
    from jaxdllm.train import TrainConfig, Trainer
    from jaxdllm.train.expert_balance import update_expert_bias

    rate = 0.01
    config = TrainConfig.from_dict({
        "model": {"preset": "tiny-llada2", "max_position": 64, "attention_impl": "xla"},
        "data": {"tasks": ["copy", "reverse"], "examples_per_task": 200, "seq_len": 32, "batch_size": 16},
        "optim": {"lr": 3e-3, "weight_decay": 0.1}, "train": {"steps": 4, "expert_bias_rate": rate},
        "log": {"every": 1, "progress": False}, "mesh": {"data": 1}})
    trainer = Trainer(config, mesh=make_mesh(devices=jax.devices()[:1]))
    history = trainer.train()
    biases = [np.asarray(trainer.params()["layers"][i]["mlp"]["expert_bias"]) for i in (1, 2)]
    for bias in biases:
        steps = bias / rate
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)  # whole multiples of the rate
        assert np.abs(steps).max() <= 4 and np.abs(bias).sum() > 0
    assert all(r["expert_load_max"] >= 1.0 and r["expert_load_cv"] >= 0 for r in history)
    loads = jnp.asarray([[4, 0, 2, 2], [1, 1, 1, 1]])  # layer means 2 and 1
    params = {"layers": {1: {"mlp": {"expert_bias": jnp.zeros(4)}}, 2: {"mlp": {"expert_bias": jnp.zeros(4)}}}}
    moved = update_expert_bias(params, loads, 0.5)
    np.testing.assert_array_equal(moved["layers"][1]["mlp"]["expert_bias"], [-0.5, 0.5, 0, 0])
    np.testing.assert_array_equal(moved["layers"][2]["mlp"]["expert_bias"], [0, 0, 0, 0])


def test_inspect_plans_llada2_mini_from_its_config_json_alone(tmp_path, capsys):
    """Before a 32 GB download: `jaxdllm inspect DIR --plan` on a folder with only config.json."""
    from jaxdllm.checkpoint.hf_config import config_to_hf
    from jaxdllm.cli import main

    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(ModelConfig.preset("llada2-mini"))))
    assert main(["inspect", str(tmp_path), "--plan", "v5e-1,v6e-1", "--plan-dtype", "int8",
                 "--plan-preset", "llada2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checked"].startswith("config.json only")
    assert 1.4e9 < summary["active_params"] < 1.5e9
    plan = summary["memory_plan"]
    assert not plan["v5e-1"]["fits"] and plan["v6e-1"]["fits"] and plan["v6e-1"]["moe_dispatch_gib"] > 0
    assert main(["inspect", str(tmp_path)]) == 2  # without --plan the weights are what it checks


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
@pytest.mark.mesh
def test_router_loads_inside_an_explicit_axes_mesh(tmp_path):
    """`jax.make_mesh` (Explicit axes, JAX's default) as the context: logits and router loads equal
    the one-device call."""
    make_llada2_checkpoint(tmp_path)
    ids = jnp.asarray(_ids(batch=8))
    want = jaxdllm.from_pretrained(tmp_path)(ids, return_router_loads=True)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    model = jaxdllm.from_pretrained(tmp_path, mesh=mesh)
    with jax.set_mesh(mesh):
        got = model(jnp.asarray(np.asarray(ids)), return_router_loads=True)
    np.testing.assert_allclose(np.asarray(got.logits), np.asarray(want.logits), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got.router_loads), np.asarray(want.router_loads))
