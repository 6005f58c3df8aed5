"""ModelConfig presets carry the published sizes; bad configs fail with actionable messages."""

import dataclasses

import pytest

from jaxdllm import ConfigError, ModelConfig, RunOptions
from jaxdllm.checkpoint import config_from_hf, config_to_hf
from jaxdllm.checkpoint.hf_config import checkpoint_dtype
from jaxdllm.models import PRESETS, RopeScaling


@pytest.mark.parametrize("name,shape,params_b", [
    ("llada-8b", (32, 4096, 32, 32, 12288, 126464), 8.02),
    ("dream-7b", (28, 3584, 28, 4, 18944, 152064), 7.62),
    ("qwen2.5-7b", (28, 3584, 28, 4, 18944, 152064), 7.62),
    ("llama-3-8b", (32, 4096, 32, 8, 14336, 128256), 8.03),
    ("fast-dllm-v2-7b", (28, 3584, 28, 4, 18944, 152064), 7.62),
])
def test_published_presets(name, shape, params_b):
    c = ModelConfig.preset(name)
    assert (c.num_layers, c.embed_dim, c.num_heads, c.num_kv_heads, c.mlp_dim, c.vocab_size) == shape
    assert c.head_dim == 128
    assert abs(c.num_params / 1e9 - params_b) < 0.01


def test_model_specific_fields():
    assert ModelConfig.preset("dream-7b").attention == "bidirectional"
    assert ModelConfig.preset("dream-7b").shift_logits and ModelConfig.preset("dream-7b").mask_token_id == 151666
    v2 = ModelConfig.preset("fast-dllm-v2-7b")
    assert (v2.attention, v2.block_size, v2.shift_logits, v2.mask_token_id, v2.eos_token_id) == (
        "block_causal", 32, True, 151665, 151645)
    assert ModelConfig.preset("llada-8b").rope_theta == 500000.0
    assert ModelConfig.preset("qwen2.5-7b").qkv_bias and not ModelConfig.preset("llama-3-8b").qkv_bias


@pytest.mark.parametrize("changes,message", [
    (dict(num_heads=6, num_kv_heads=4), r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"),
    (dict(attention="block_causal"), "needs a positive block_size"),
    (dict(attention="sliding"), "attention must be one of"),
    (dict(mask_token_id=300), r"mask_token_id=300 is outside the vocabulary \[0, 256\)"),
    (dict(embed_dim=0), "embed_dim must be a positive integer"),
    (dict(head_dim=15), "head_dim must be even"),
    (dict(checkpoint_format="gguf"), "checkpoint_format must be one of"),
])
def test_invalid_configs(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.preset("tiny-llama", **changes)


@pytest.mark.parametrize("changes,message", [
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(param_dtype="int4"), "param_dtype must be one of"),
    (dict(attention_impl="cuda"), "attention_impl must be one of"),
    (dict(remat="some"), "remat must be one of"),
    (dict(quantization="int4"), "quantization must be None or one of"),
    (dict(scan_layers="yes"), "scan_layers must be"),
])
def test_invalid_run_options(changes, message):
    with pytest.raises(ConfigError, match=message):
        RunOptions(**changes)


def test_run_options_are_not_config_fields():
    """What a model is and how it runs are separate: no field is both."""
    assert not set(RunOptions.fields()) & {f.name for f in dataclasses.fields(ModelConfig)}
    with pytest.raises(TypeError):
        ModelConfig.preset("tiny-llama", scan_layers=True)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match=r"unknown model preset 'llada-80b'; known presets: \[.*'llada-8b'"):
        ModelConfig.preset("llada-80b")


def test_rope_scaling_validation():
    with pytest.raises(ConfigError, match="rope_scaling type 'yarn' is not supported"):
        RopeScaling(type="yarn", factor=2.0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dict_and_hf_config_round_trips(name):
    c = PRESETS[name].replace(rope_scaling=RopeScaling("llama3", 8.0)) if "llama" in name else PRESETS[name]
    assert ModelConfig.from_dict(c.to_dict()) == c
    written = config_to_hf(c, "bfloat16")
    # the HF config carries no eot id; everything else survives, and the weights' dtype beside it
    assert config_from_hf(written).replace(eot_token_id=c.eot_token_id) == c
    assert checkpoint_dtype(written) == "bfloat16"


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ConfigError, match=r"unknown ModelConfig fields \['n_layers'\]"):
        ModelConfig.from_dict({**PRESETS["tiny-llama"].to_dict(), "n_layers": 2})


def test_to_dict_nests_the_expert_settings_and_from_dict_reads_the_older_flat_layout():
    moe, dense = PRESETS["tiny-llada2"], PRESETS["tiny-llada"]
    assert moe.to_dict()["experts"] == dataclasses.asdict(moe.experts) and dense.to_dict()["experts"] is None
    # `jaxdllm_config.json` and training metadata written before the expert settings were nested
    flat_moe = {**{k: v for k, v in moe.to_dict().items() if k != "experts"}, **dataclasses.asdict(moe.experts)}
    assert ModelConfig.from_dict(flat_moe) == moe
    older_dense = dict(num_experts=0, experts_per_token=0, expert_dim=0, num_shared_experts=0, expert_groups=1,
                       top_groups=1, first_dense_layers=0, routed_scaling=1.0)
    flat_dense = {**{k: v for k, v in dense.to_dict().items() if k != "experts"}, **older_dense}
    assert ModelConfig.from_dict(flat_dense) == dense
    with pytest.raises(ConfigError, match="both flat"):
        ModelConfig.from_dict({**moe.to_dict(), "num_experts": 8})


def test_a_recipe_changes_a_presets_expert_settings_in_a_table(tmp_path):
    from jaxdllm.train import TrainConfig
    from jaxdllm.train.setup import build_model_config, load_tokenizer

    path = tmp_path / "moe.toml"
    path.write_text('[model]\npreset = "tiny-llada2"\n[model.experts]\nnum_experts = 32\ntop_groups = 1\n')
    recipe = TrainConfig.from_toml(path)
    experts = build_model_config(recipe, load_tokenizer(recipe)).experts
    assert experts == dataclasses.replace(PRESETS["tiny-llada2"].experts, num_experts=32, top_groups=1)
    path.write_text('[model]\npreset = "tiny-llada2"\n[model.experts]\nnum_expert = 8\n')
    with pytest.raises(ConfigError, match=r"\[model.experts\] has unknown key\(s\) \['num_expert'\]"):
        TrainConfig.from_toml(path)
    path.write_text('[model]\npreset = "tiny-llada2"\nnum_experts = 8\n')  # the settings live in the table
    with pytest.raises(ConfigError, match=r"\[model\] has unknown key\(s\) \['num_experts'\]"):
        TrainConfig.from_toml(path)


def test_every_shipped_recipe_loads():
    """Each recipe in `training/` parses and validates (an unknown key or a bad value would fail here)."""
    from pathlib import Path

    from jaxdllm.train import TrainConfig

    recipes = sorted((Path(__file__).resolve().parents[2] / "training").glob("*.toml"))
    assert len(recipes) >= 10
    for path in recipes:
        TrainConfig.from_toml(path)
