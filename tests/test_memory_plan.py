"""The memory plan against what JAX and XLA report: per-device parameter bytes against the
shards a real placement makes, and whole programs against `compiled.memory_analysis()`."""

import jax
import pytest
from flax import nnx

from jaxdllm import ModelConfig, RunOptions, SamplerConfig, Transformer, sharding
from jaxdllm.errors import ConfigError
from jaxdllm.memory_plan import (GIB, RUNTIMES, MeshShape, parameter_bytes, runtime_mesh, sampling_plan,
                                 training_plan)
from support import registries
from jaxdllm.train import TrainConfig

TINY = dict(embed_dim=256, mlp_dim=1024, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64, max_position=1024)


# Every mesh for the float dense model in the default run; the MoE (float and int8) and the int8
# combinations in the slow run (the default run's 6-minute budget).
PLACEMENTS = [(mesh, quantization, model) for model in ("tiny-llada", "tiny-llada2") for quantization in (None, "int8")
              for mesh in ((1, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2))]
DEFAULT_PLACEMENTS = {(m, None, "tiny-llada") for m in ((1, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2))}


@pytest.mark.parametrize("mesh_shape,quantization,model", [
    p if p in DEFAULT_PLACEMENTS else pytest.param(*p, marks=pytest.mark.slow) for p in PLACEMENTS])
@pytest.mark.mesh
def test_parameter_bytes_equal_the_largest_device_share_of_a_real_placement(mesh_shape, quantization, model):
    data, fsdp, tensor = mesh_shape
    config, options = ModelConfig.preset(model, **TINY), RunOptions(quantization=quantization)
    mesh = sharding.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=jax.devices()[:data * fsdp * tensor])
    model = sharding.shard_model(Transformer(config, options, rngs=nnx.Rngs(0)), mesh)
    per_device: dict = {}
    for leaf in jax.tree.leaves(nnx.state(model)):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    assert parameter_bytes(config, MeshShape(data, fsdp, tensor), options=options) == max(per_device.values())


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_the_plan_is_within_15_percent_of_xla():
    """Sampling and one training step of a small model, compiled here: the plan's total against
    XLA's arguments + temporaries + outputs - donated buffers (`sampling/benchmarks/memory_plan_check.py`
    runs more shapes)."""
    from jaxdllm.decoding import Sampler
    from jaxdllm.lowering import abstract_model, lower_train_step

    config = ModelConfig.preset("tiny-llada", **TINY)

    def xla(compiled):
        m = compiled.memory_analysis()
        return m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes

    for name in ("llada", "fast-dllm-dual"):
        sampler = SamplerConfig.preset(name, gen_length=256, block_length=32)
        got = xla(Sampler(abstract_model(config)).lower((4, 128), sampler).compile())
        plan = sampling_plan(config, sampler, batch=4, prompt_len=128, platform="cpu").total
        assert abs(plan / got - 1) < 0.15, (name, plan, got)
    recipe = TrainConfig.from_dict({"model": {"preset": "tiny-llada"}, "data": {"batch_size": 8, "seq_len": 128}})
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    got = xla(lower_train_step(recipe, config, mesh, rows=8, seq_len=128).compile())
    plan = training_plan(config, recipe, platform="cpu").total
    assert abs(plan / got - 1) < 0.15, (plan, got)


def _xla_bytes(compiled) -> int:
    """XLA's arguments + temporaries + outputs - donated buffers of a compiled program."""
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


# Per registered canvas: the presets whose compiled loop the plan is held to, each with its model
# preset (and overrides) and the second model its policy runs ({role: model preset}). A canvas without an
# entry fails the test, naming this table. All are in the slow run (the default run's 6-minute budget;
# it keeps test_a_plan_of_a_loop_with_a_second_model_needs_that_model).
_DG = dict(embed_dim=256, mlp_dim=1024, vocab_size=1024, block_size=256)  # the published 256-token canvas
CANVAS_PLANS = {
    "masked_canvas": [("llada", "tiny-llada", TINY, {}), ("fast-dllm-dual", "tiny-llada", TINY, {})],
    "draft_canvas": [("jacobi", "tiny-qwen2", TINY, {}), ("specdiff", "tiny-qwen2", TINY, {"drafter": "tiny-llada"})],
    "uniform_canvas": [("diffusiongemma", "tiny-diffusiongemma", _DG, {})],
    "freedave_canvas": [("freedave", "tiny-llada", TINY, {})],
    "genmol_canvas": [("genmol", "tiny-llada", TINY, {}), ("genmol-motif", "tiny-llada", TINY, {})],
    "apd_canvas": [("apd", "tiny-llada", TINY, {"verifier": "tiny-qwen2"})],
    "wedlm_canvas": [("wedlm", "tiny-wedlm", TINY, {})],
    "assd_canvas": [("assd", "tiny-xlnet", {**TINY, "num_kv_heads": TINY["num_heads"]}, {})],  # XLNet: no GQA
    # the ids a checkpoint's tokenizer would give (any below the vocabulary)
    "multiverse_canvas": [("multiverse", "tiny-qwen2", TINY, {}, {"tag_base": 40, "digit_ids": tuple(range(20, 30)),
                                                                   "colon_id": 30, "newline_id": 31})],
    "hogwild_canvas": [("hogwild", "tiny-qwen2", TINY, {}, {
        "first_steps": ((10,) * 12, (11,) * 8), "header_prefixes": ((14,) * 4, (15,) * 3), "header_suffix": (16,) * 4,
        "digit_ids": tuple(range(20, 30)), "others_header": (17,) * 9, "own_header": (18,) * 11,
        "check_ids": (19,) * 12, "finisher_ids": (30,) * 30})],
}


def _canvas_cases():
    for canvas in registries.canvases():
        if canvas not in CANVAS_PLANS:
            yield pytest.param(canvas, None, id=canvas)
            continue
        for case in CANVAS_PLANS[canvas]:
            yield pytest.param(canvas, case, id=f"{canvas}-{case[0]}", marks=pytest.mark.slow)


@pytest.mark.parametrize("canvas,case", list(_canvas_cases()))
def test_every_canvas_plan_is_within_20_percent_of_xla(canvas, case):
    """Each canvas's footprint, turned into bytes by the plan, against XLA's byte count of the compiled
    loop (prompts [4, 128], 256 generated tokens; no weights: abstract parameters), second models
    included: SpecDiff's drafter and APD's verifier enter the loop as abstract models too."""
    from jaxdllm.decoding import Sampler
    from jaxdllm.lowering import abstract_model

    if case is None:
        pytest.fail(f"canvas {canvas!r} is registered but has no entry in CANVAS_PLANS (tests/test_memory_plan.py)")
    preset, model, overrides, companions, *settings = case
    config = ModelConfig.preset(model, **overrides)
    canvas_length = {"block_length": config.block_size} if canvas == "uniform_canvas" else {}
    sampler = SamplerConfig.preset(preset, gen_length=256, **canvas_length, **(settings[0] if settings else {}))
    assert sampler.canvas.name == canvas
    configs = {role: ModelConfig.preset(name, **TINY) for role, name in companions.items()}
    second = abstract_model(next(iter(configs.values()))) if configs else None
    got = _xla_bytes(Sampler(abstract_model(config)).lower((4, 128), sampler, policy_params=second).compile())
    plan = sampling_plan(config, sampler, batch=4, prompt_len=128, platform="cpu", companions=configs)
    for role in configs:
        assert plan.terms[f"{role}_weights"] == parameter_bytes(configs[role])
    assert abs(plan.total / got - 1) < 0.2, (preset, plan.total, got, plan.terms)


def test_a_plan_of_a_loop_with_a_second_model_needs_that_model():
    """The plan refuses to leave out a second model the policy runs, and one it does not run."""
    config = ModelConfig.preset("tiny-llada", **TINY)
    with pytest.raises(ConfigError, match=r"runs a verifier in the loop: pass its ModelConfig as "
                                          r"sampling_plan\(\.\.\., companions=\{'verifier': config\}\)"):
        sampling_plan(config, SamplerConfig.preset("apd"), batch=1, prompt_len=32)
    with pytest.raises(ConfigError, match="runs no 'drafter'"):
        sampling_plan(config, SamplerConfig.preset("llada"), batch=1, prompt_len=32, companions={"drafter": config})


@pytest.mark.parametrize("prompt_len", [96, 100])
def test_a_block_causal_plan_holds_the_canvas_the_sampler_builds(prompt_len):
    """LLaDA2 decodes from the block that holds the prompt's end: 96 columns of whole blocks, the
    block of the tail (of 4 tokens, or none: one compiled shape for both), then 256."""
    from jaxdllm.decoding.sampler import prepare

    config, sampler = ModelConfig.preset("tiny-llada2", **TINY), SamplerConfig.preset("llada2", cache="block")
    lay = prepare(config, jax.numpy.ones((2, prompt_len), int), None, sampler.replace(prompt_bucket=32)).lay
    assert lay.total == 96 + 32 + 256
    plan = sampling_plan(config, sampler, batch=2, prompt_len=prompt_len, platform="cpu")
    assert plan.terms["decode_state"] == 2 * lay.total * 16


def test_the_training_plan_asks_the_objective_how_many_views_it_stacks():
    config = ModelConfig.preset("tiny-llada", **TINY)
    plans = {}
    for views in (1, 2):
        recipe = TrainConfig.from_dict({"model": {"preset": "tiny-llada"}, "data": {"batch_size": 8, "seq_len": 128},
                                        "objective": {"kind": "certainty_forcing", "num_views": views}})
        assert recipe.objective.build().stacked_views == views
        plans[views] = training_plan(config, recipe, platform="cpu").terms
    assert plans[2]["activations"] == 2 * plans[1]["activations"] and plans[2]["logits"] == 2 * plans[1]["logits"]
    sft = TrainConfig.from_dict({"model": {"preset": "tiny-llada"}, "data": {"batch_size": 8, "seq_len": 128}})
    assert training_plan(config, sft, platform="cpu").terms == plans[1]


def test_moe_step_reads_follow_the_experts_a_step_runs():
    """LLaDA2.0-mini: parameters and active parameters from the config alone (16.3B / 1.43B), and the
    weights one forward reads: one token runs 8 of 256 experts per layer, a 32-token block about 163,
    a whole canvas all of them (uniform routing)."""
    from jaxdllm.memory_plan import expected_experts_touched, step_weight_bytes

    mini = ModelConfig.preset("llada2-mini")
    bf16 = RunOptions(param_dtype="bfloat16", dtype="bfloat16")  # the published checkpoints' dtype
    assert parameter_bytes(mini, options=bf16) == mini.num_params * 2 + 19 * 256 * 2  # the routers' biases stay float32
    assert expected_experts_touched(mini, 1) == pytest.approx(8)
    assert expected_experts_touched(mini, 32) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 32))
    one = step_weight_bytes(mini, 1, "bfloat16")
    expert = 3 * 2048 * 512 * 2
    assert one == pytest.approx(parameter_bytes(mini, options=bf16) - 19 * (256 - 8) * expert, rel=1e-9)
    assert step_weight_bytes(mini, 10_000, "bfloat16") == pytest.approx(parameter_bytes(mini, options=bf16), rel=1e-6)


def test_llada_8b_on_the_colab_runtimes():
    """bf16 LLaDA-8B: 14.9 GiB of weights alone, so a v5e-1 (16 GiB) cannot also hold the
    decoding state with XLA's headroom; a v6e-1 (32 GiB) can, and a v2-8 or v5e-8 shares it out."""
    config = ModelConfig.preset("llada-8b")
    assert parameter_bytes(config, dtype="bfloat16") == config.num_params * 2
    sampler = SamplerConfig.preset("fast-dllm-dual")
    one = sampling_plan(config, sampler, batch=1, prompt_len=256, dtype="bfloat16")
    assert not one.fits(RUNTIMES["v5e-1"]) and one.fits(RUNTIMES["v6e-1"])
    eight = sampling_plan(config, sampler, batch=8, prompt_len=256, mesh=runtime_mesh(RUNTIMES["v2-8"]),
                          dtype="bfloat16")
    assert eight.fits(RUNTIMES["v2-8"]) and eight.terms["weights"] < one.terms["weights"] / 7
    assert one.total / GIB == pytest.approx(sum(one.terms.values()) / GIB)
    with pytest.raises(ConfigError, match="not divisible"):
        runtime_mesh(RUNTIMES["v5p-8"], tensor=3)


@pytest.mark.parametrize("kind,count,gib,fits,mesh,weights", [
    ("TPU v5 lite", 1, 16, True, "1x1x1", "int8"),     # Colab v5e-1: bf16 leaves no room, int8 fits
    ("TPU v6 lite", 1, 32, True, "1x1x1", "bfloat16"),  # Colab v6e-1
    ("TPU v2", 8, 8, True, "1x1x8", "bfloat16"),        # Colab's legacy v2-8: tensor parallel over 8 cores
    ("TPU v5 lite", 8, 16, True, "1x1x8", "bfloat16"),  # v5e-8
    ("cpu", 1, None, True, "1x1x1", "bfloat16"),        # no device memory reported
    ("TPU v5 lite", 1, 8, False, "1x1x1", "int8"),      # a chip too small even for int8 weights
])
def test_notebook_02_picks_a_layout_from_the_device_it_finds(kind, count, gib, fits, mesh, weights):
    """The choice notebook 02 makes before downloading LLaDA-8B, from faked device facts."""
    from jaxdllm.memory_plan import DeviceFacts, choose_decoding_setup

    facts = DeviceFacts(kind, count, None if gib is None else gib * GIB)
    setup = choose_decoding_setup(ModelConfig.preset("llada-8b"), SamplerConfig.preset("fast-dllm-dual"), facts,
                                  prompt_len=128)
    assert setup.fits is fits and str(setup.mesh) == mesh and setup.dtype == weights
    assert setup.load_kwargs == ({"quantization": "int8"} if weights == "int8" else {"dtype": weights})
    if weights == "int8":  # bf16 alone would not fit this chip
        assert setup.plan.terms["weights"] < 8.5 * GIB
    if not fits:  # one sentence: what is needed, what this runtime offers, where it fits
        assert "needs 8.2 GiB per device (int8 weights 8.0 GiB)" in setup.message
        assert "offers 7.2 GiB usable of 8.0" in setup.message and "fits on v5e-1, v6e-1, v2-8" in setup.message


def test_a_uniform_canvas_plan_holds_the_encoder_cache_and_the_canvas_logits():
    """The uniform canvas keeps the encoder's cache over the prompt and every canvas, each layer with
    its own K/V shape (the tiny preset: sliding 2 x 16, full 1 x 32), and ten float32 [canvas,
    vocab] buffers per row; its widest forward is the prompt's prefill."""
    config = ModelConfig.preset("tiny-diffusiongemma")
    sampler = SamplerConfig.preset("diffusiongemma", gen_length=24, block_length=8)
    plan = sampling_plan(config, sampler, batch=2, prompt_len=40, platform="cpu")
    slots, per_slot = 40 + 24, 2 * (2 * 16) + 2 * (1 * 32)
    assert plan.terms["kv_cache"] == 2 * 2 * slots * per_slot * 4
    assert plan.terms["logits"] == 10 * 2 * 8 * 256 * 4
    assert plan.terms["decode_state"] == 2 * slots * 16


@pytest.mark.slow  # two abstract 25B-parameter models (bf16, int8): the default run's 6-minute budget
def test_diffusiongemma_26b_on_the_colab_runtimes_and_slices():
    """DiffusionGemma-26B-A4B: 47 GiB of bf16 weights fit no single chip; int8 (24.3 GiB) fits a
    v6e-1 (32 GiB) and not a v5e-1; bf16 shares out over a v5e-8. The uniform canvas keeps the
    encoder's cache with each layer's own K/V shape (sliding 8 x 256, full 2 x 512) over the prompt
    and the canvases, and ten float32 [canvas, vocab] buffers per row."""
    config, sampler = ModelConfig.preset("diffusiongemma-26b-a4b"), SamplerConfig.preset("diffusiongemma")
    plan = lambda runtime, dtype: sampling_plan(config, sampler, batch=RUNTIMES[runtime].devices, prompt_len=512,
                                                mesh=runtime_mesh(RUNTIMES[runtime]), dtype=dtype)
    assert not plan("v6e-1", "bfloat16").fits(RUNTIMES["v6e-1"])
    assert plan("v6e-1", "int8").fits(RUNTIMES["v6e-1"]) and not plan("v5e-1", "int8").fits(RUNTIMES["v5e-1"])
    assert plan("v5e-8", "bfloat16").fits(RUNTIMES["v5e-8"])
    one = plan("v6e-1", "int8")
    slots, per_slot = 512 + 256, 25 * 8 * 256 + 5 * 2 * 512
    assert one.terms["kv_cache"] == 2 * slots * per_slot * 2
    assert one.terms["logits"] == 10 * 256 * 262144 * 4
