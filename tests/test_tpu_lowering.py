"""Every program a TPU (or GPU) user runs, lowered for that platform on this CPU with
`jax.export`: the compiled decoding loop per preset at real 7-8B shapes on the meshes a v5e-8 or a
single chip gives, and one training step per objective. No weights: the parameters are shapes
and shardings (`jaxdllm.lowering.abstract_model`). Each program must lower, hold the splash
Mosaic kernel (TPU) or the Triton kernel (CUDA) where attention runs over 128 or more queries,
and hold no host callback."""

import jax
import numpy as np
import pytest

from jaxdllm import ModelConfig, RunOptions, SamplerConfig, generate, sharding
from jaxdllm.decoding import Sampler
from jaxdllm.lowering import abstract_model, export_train_step, program_facts
from jaxdllm.train import TrainConfig

BF16 = "bfloat16"  # the published checkpoints' parameter and compute dtype

pytestmark = pytest.mark.mesh

MODEL_OF = {"llada": "llada-8b", "fast-dllm-parallel": "llada-8b", "fast-dllm-prefix": "llada-8b",
            "fast-dllm-dual": "llada-8b", "dparallel": "llada-8b", "prophet": "llada-8b", "dream": "dream-7b",
            "jacobi": "qwen2.5-7b", "jacobi-forcing": "qwen2.5-7b", "lookahead": "qwen2.5-7b",
            "block-diffusion": "fast-dllm-v2-7b", "sdar": "sdar-8b", "sbd": "qwen3-8b",
            "wedlm": "wedlm-7b", "multiverse": "qwen2.5-7b", "hogwild": "qwen2.5-7b"}
# Further models under a preset above, model -> preset (the slow run, ~5 s each): Qwen3's q/k norm.
MORE_MODELS = {"qwen3-8b": "jacobi"}
MESHES = [(1, 1, 1), (1, 4, 2), (2, 2, 2), (1, 8, 1)]   # (data, fsdp, tensor): one chip, and v5e-8 layouts


# Settings a checkpoint's tokenizer gives (`Policy.tokenizer_settings`): Qwen2.5's ids of the Multiverse tags,
# digits, ':' and newline; Hogwild! texts of the default format's lengths in Qwen2.5 tokens.
TOKENIZER_SETTINGS = {
    "multiverse": dict(tag_base=151665, digit_ids=tuple(range(15, 25)), colon_id=25, newline_id=198),
    "hogwild": dict(first_steps=((10,) * 20, (11,) * 12), header_prefixes=((14,) * 4, (15,) * 3), header_suffix=(16,) * 4,
                    digit_ids=tuple(range(15, 25)), others_header=(17,) * 9, own_header=(18,) * 11,
                    check_ids=(19,) * 14, finisher_ids=(30,) * 40),
}


def _sampler(preset: str) -> SamplerConfig:
    if preset == "block-diffusion":  # Fast-dLLM v2: blocks of its block size, threshold decoding
        return SamplerConfig(gen_length=256, block_length=32, policy="threshold", threshold=0.9)
    return SamplerConfig.preset(preset, **TOKENIZER_SETTINGS.get(preset, {}))


# A Set Block Decoding fine-tune of Qwen3-8B keeps its shape and adds a mask token (training/set_block_qwen3_8b.toml).
MODEL_OVERRIDES = {"sbd": {"mask_token_id": 151669}}


def _export_decode(preset: str, mesh_shape, platform="tpu", impl="auto", model_preset: str | None = None):
    data, fsdp, tensor = mesh_shape
    mesh = sharding.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=jax.devices()[:data * fsdp * tensor])
    config = ModelConfig.preset(model_preset or MODEL_OF[preset], **MODEL_OVERRIDES.get(preset, {}))
    model = abstract_model(config, mesh, options=RunOptions(BF16, BF16, attention_impl=impl))
    return program_facts(Sampler(model).export((8, 128), _sampler(preset), platform=platform))


def _check(facts, platform="tpu"):
    assert facts["platforms"] == [platform] and facts["while_loops"] >= 1
    assert facts["host_callbacks"] == 0
    kernels = facts["mosaic_kernels"] if platform == "tpu" else facts["triton_kernels"]
    assert kernels >= 1, facts


# The default run: diffusion with a cache on a v5e-8 layout and Lookahead on one chip; the slow run: the rest (below).
DEFAULT = [("fast-dllm-dual", (1, 4, 2)), ("lookahead", (1, 1, 1))]  # the rest: the slow run (6-minute budget)
# the shared-page canvases on one chip and on a sharded layout (their attention and pages shard like any batch)
MESHES_OF = {"multiverse": [(1, 1, 1), (1, 4, 2)], "hogwild": [(1, 1, 1), (2, 2, 2)]}
# Every other preset on one chip and on one of the three sharded layouts, taken in turn: each sharded
# layout lowers with four presets or more (the partitioning is the model's and the loop state's, shared
# by every preset; tests/test_meshes.py runs them sharded against one device).
SHARDED = [(1, 4, 2), (2, 2, 2), (1, 8, 1)]


def _meshes(index: int, preset: str):
    return MESHES_OF.get(preset, [(1, 1, 1), SHARDED[index % len(SHARDED)]])


SLOW = [pytest.param(p, m, marks=pytest.mark.slow) for i, p in enumerate(MODEL_OF) for m in _meshes(i, p)
        if (p, m) not in DEFAULT]


@pytest.mark.parametrize("preset,mesh_shape", DEFAULT + SLOW,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_the_decoding_loop_lowers_for_tpu(preset, mesh_shape):
    _check(_export_decode(preset, mesh_shape))


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("model_preset", MORE_MODELS)
def test_the_decoding_loop_lowers_for_tpu_on_more_models(model_preset, mesh_shape):
    _check(_export_decode(MORE_MODELS[model_preset], mesh_shape, model_preset=model_preset))


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_llada_8b_with_int8_weights_lowers_for_one_tpu_chip():
    """What notebook 02 runs on a Colab v5e-1: LLaDA-8B, int8 linear layers, the dual cache, one chip."""
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    model = abstract_model(ModelConfig.preset("llada-8b"), mesh, options=RunOptions(BF16, BF16, quantization="int8"))
    assert str(model.lm_head.get_value().dtype) == "int8" and model.lm_head_scale is not None
    _check(program_facts(Sampler(model).export((1, 128), _sampler("fast-dllm-dual"), platform="tpu")))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llada", "jacobi-forcing"])
def test_the_decoding_loop_lowers_for_cuda_with_the_triton_kernel(preset):
    try:
        facts = _export_decode(preset, (1, 8, 1), platform="cuda")
    except RuntimeError as e:  # newer JAX lowers Pallas Triton only with a GPU device present
        if "No supported GPU devices found" not in str(e):
            raise
        pytest.skip(f"jax {jax.__version__} cannot lower the Triton kernel without a GPU")
    _check(facts, platform="cuda")


def test_lowering_for_tpu_leaves_this_machines_runs_alone():
    """A program traced for a TPU is never reused on the CPU: the same model and settings still
    decode here, with the same tokens, after an export."""
    from flax import nnx

    from jaxdllm import Transformer

    config = ModelConfig.preset("tiny-llada", max_position=512)
    model = Transformer(config, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(5, 100, (2, 128)).astype(np.int32)
    sampler_config = SamplerConfig(gen_length=128, block_length=128, steps=4)
    before = generate(model, ids, sampler_config)
    facts = program_facts(Sampler(model).export(ids.shape, sampler_config, platform="tpu"))
    assert facts["mosaic_kernels"] >= 1
    after = generate(model, ids, sampler_config)
    np.testing.assert_array_equal(after.tokens, before.tokens)


def _recipe(objective: dict, grad_accum: int = 1, lora_rank: int = 0, attention_impl: str = "auto") -> TrainConfig:
    data = {"source": "trajectories", "path": "never-read.jsonl"} if objective["kind"] == "jacobi_forcing" else {}
    return TrainConfig.from_dict({"model": {"preset": "tiny-llada", "attention_impl": attention_impl},
                                  "objective": objective, "data": data,
                                  "optim": {"grad_accum": grad_accum}, "lora": {"rank": lora_rank}})


OBJECTIVES = {  # objective -> (model preset, recipe section)
    "mdm_sft": ("llada-8b", {"kind": "mdm_sft"}),
    "mdm_pretrain": ("llada-8b", {"kind": "mdm_pretrain"}),
    "certainty_forcing": ("llada-8b", {"kind": "certainty_forcing"}),
    "block_diffusion": ("fast-dllm-v2-7b", {"kind": "block_diffusion", "block_size": 32}),
    "causal_lm": ("qwen2.5-7b", {"kind": "causal_lm"}),
    "jacobi_forcing": ("qwen2.5-7b", {"kind": "jacobi_forcing"}),
    "wedlm": ("wedlm-7b", {"kind": "wedlm", "block_size": 32}),
}


@pytest.mark.parametrize("objective", [pytest.param(o, marks=pytest.mark.slow) for o in OBJECTIVES])
def test_a_training_step_lowers_for_tpu_at_real_shapes(objective):
    """Forward and backward with splash (`interpret=False`) on a v5e-8 layout (fsdp 8), AdamW
    state sharded like the parameters."""
    preset, section = OBJECTIVES[objective]
    mesh = sharding.make_mesh(data=1, fsdp=8, tensor=1)
    config = ModelConfig.preset(preset)
    facts = program_facts(export_train_step(_recipe(section, attention_impl="splash"), config, mesh, rows=8, seq_len=512))
    assert facts["platforms"] == ["tpu"] and facts["mosaic_kernels"] >= 1 and facts["host_callbacks"] == 0


@pytest.mark.slow
def test_a_lora_step_with_accumulation_lowers_for_tpu():
    """LoRA adapters and gradient accumulation (a scan over micro-batches), at 8B width with 2
    layers (the adapters are real arrays, drawn on the host)."""
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    config = ModelConfig.preset("llada-8b", num_layers=2)
    recipe = _recipe({"kind": "certainty_forcing"}, grad_accum=2, lora_rank=16, attention_impl="splash")
    facts = program_facts(export_train_step(recipe, config, mesh, rows=8, seq_len=256))
    assert facts["mosaic_kernels"] >= 1 and facts["host_callbacks"] == 0


# The two MoE models' real shapes take a minute each to lower: int8 on one chip for LLaDA2, bf16 with the
# experts over 8 chips for DiffusionGemma (tests/test_memory_plan.py plans both ways for both models).
@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape,weights,prompt_len", [((1, 1, 1), "int8", 140)], ids=["v6e-1-int8"])
def test_llada2_mini_decoding_loop_lowers_for_tpu(mesh_shape, weights, prompt_len):
    """LLaDA2.0-mini at its real shape (16B parameters, 256 experts, abstract weights) with the `llada2`
    preset and the exact block cache: int8 on one chip (what fits a v6e-1). The routed experts lower to
    XLA's ragged dot, not a loop over experts.
    A prompt of 140 tokens ends inside a block: the first decoded block holds its 12-token tail
    (the 128 before it are prefilled by the splash kernel)."""
    data, fsdp, tensor = mesh_shape
    mesh = sharding.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=jax.devices()[:data * fsdp * tensor])
    config = ModelConfig.preset("llada2-mini")
    model = abstract_model(config, mesh, options=RunOptions(BF16, BF16, quantization="int8" if weights == "int8" else None))
    assert model.layers[1].mlp.gate.kernel.get_value().shape == (256, 2048, 512)
    exported = Sampler(model).export((fsdp, prompt_len), SamplerConfig.preset("llada2", cache="block"), platform="tpu")
    facts = program_facts(exported)
    _check(facts)
    assert facts["ragged_dots"] >= 3 * config.num_moe_layers  # gate, up, down


@pytest.mark.slow  # a 25B-parameter program: the slow run
@pytest.mark.parametrize("mesh_shape,weights", [((1, 8, 1), "bfloat16")], ids=["v5e-8-bf16"])
def test_diffusiongemma_decoding_loop_lowers_for_tpu(mesh_shape, weights):
    """DiffusionGemma-26B-A4B at its real shape (abstract weights) with the `diffusiongemma` preset:
    bf16 with the experts over an 8-way fsdp axis (a v5e-8).
    The 256-token prompt's causal prefill and the canvas's denoising steps run the splash kernel,
    sliding windows included; the experts lower to XLA's ragged dot."""
    data, fsdp, tensor = mesh_shape
    mesh = sharding.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=jax.devices()[:data * fsdp * tensor])
    config = ModelConfig.preset("google/diffusiongemma-26B-A4B-it")
    model = abstract_model(config, mesh, options=RunOptions(BF16, BF16, quantization="int8" if weights == "int8" else None))
    assert model.layers[5].experts.gate.kernel.get_value().shape == (128, 2816, 704)
    exported = Sampler(model).export((fsdp, 256), SamplerConfig.preset("diffusiongemma"), platform="tpu")
    facts = program_facts(exported)
    _check(facts)
    assert facts["ragged_dots"] >= 3 * config.num_layers
