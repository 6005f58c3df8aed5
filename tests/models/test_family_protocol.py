"""A family owns its model: it is checked against the protocol when it is registered, it builds its
own model class and counts its parameters from it, and its sampler defaults fail in one line where
a request does not fit the model."""

import dataclasses
import math

import jax.numpy as jnp
import pytest
from flax import nnx

from jaxdllm import ConfigError, ModelConfig, SamplerConfig, Transformer
from jaxdllm.cli import main
from jaxdllm.models.families import FAMILIES, family_of, register
from jaxdllm.models.families.diffusion_gemma import DiffusionGemmaTransformer, generation
from jaxdllm.models.families.family import FAMILY_PROTOCOL
from jaxdllm.models.transformer import MODEL_PROTOCOL
from jaxdllm.pretrained import sampler_defaults


def _llada():
    return next(f for f in FAMILIES if f.name == "llada")


@pytest.mark.parametrize("method", ["config_from_hf", "config_to_hf", "tensor_table"])
def test_a_family_missing_a_protocol_method_is_refused_at_registration(method):
    incomplete = dataclasses.replace(_llada(), name="incomplete", **{method: None})
    with pytest.raises(ConfigError, match=rf"'incomplete' does not provide \['{method}'\]"):
        register(incomplete)


def test_a_family_object_without_the_method_at_all_is_refused():
    class NoTable:  # a family written by hand, without dataclasses.replace: no tensor_table attribute
        name = "hand_written"

    family = _llada()
    for name in FAMILY_PROTOCOL:
        if name != "tensor_table":
            setattr(NoTable, name, getattr(family, name))
    with pytest.raises(ConfigError, match=r"'hand_written' does not provide \['tensor_table'\]"):
        register(NoTable())


def test_a_family_whose_model_lacks_a_protocol_method_is_refused():
    class NoHead:  # embeds and builds layers, but has no unembed
        embed_inputs = make_layer = norm_output = init_cache = staticmethod(lambda *a, **k: None)

    with pytest.raises(ConfigError, match=r"its model .* lacks \['unembed'\]"):
        register(dataclasses.replace(_llada(), name="headless", model=NoHead))
    assert set(MODEL_PROTOCOL) == {"embed_inputs", "make_layer", "norm_output", "unembed", "init_cache"}


def test_a_preset_of_another_config_class_is_refused():
    gemma = family_of(ModelConfig.preset("tiny-diffusiongemma"))
    wrong = dataclasses.replace(gemma, name="wrong", presets={"tiny-llada-as-gemma": ModelConfig.preset("tiny-llada")})
    with pytest.raises(ConfigError, match="preset 'tiny-llada-as-gemma' is not one of its configs"):
        register(wrong)


def test_every_registered_family_keeps_the_protocol_and_its_presets_build_its_model():
    for family in FAMILIES:
        for name in FAMILY_PROTOCOL:
            assert callable(getattr(family, name)), (family.name, name)
        tiny = next(c for n, c in family.presets.items() if n.startswith("tiny"))
        model = nnx.eval_shape(lambda: Transformer(tiny, rngs=nnx.Rngs(0)))
        assert type(model) is family.model, family.name


@pytest.mark.slow  # the default run's 6-minute budget; the protocol checks at registration stay there
def test_the_diffusiongemma_model_has_its_own_forward_inputs_and_the_shared_one_refuses_them():
    gemma = Transformer(ModelConfig.preset("tiny-diffusiongemma"), rngs=nnx.Rngs(0))
    assert isinstance(gemma, DiffusionGemmaTransformer)
    assert gemma(jnp.zeros((1, 4), jnp.int32), encode=True).logits.shape == (1, 4, 256)
    llada = Transformer(ModelConfig.preset("tiny-llada"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"takes no forward input\(s\) \['encode'\]"):
        llada(jnp.zeros((1, 4), jnp.int32), encode=True)


def test_parameter_counts_come_from_the_model_and_count_routed_experts_by_share():
    c = ModelConfig.preset("tiny-llada2")
    shapes = family_of(c).parameter_shapes(c)
    total = sum(math.prod(s) for s, _, _ in shapes)
    assert c.num_params == total
    routed = sum(math.prod(s) for s, _, axes in shapes if axes and axes[0] == "expert")
    e = c.experts
    assert c.active_params == total - routed + routed * e.experts_per_token // e.num_experts
    dense = ModelConfig.preset("tiny-llada")
    assert dense.num_params == dense.active_params


def test_the_family_default_length_is_the_presets():
    assert generation.DEFAULT_LENGTH == SamplerConfig.preset(generation.PRESET).gen_length


def test_the_family_picks_the_default_preset():
    assert family_of(ModelConfig.preset("tiny-diffusiongemma")).default_preset(
        ModelConfig.preset("tiny-diffusiongemma")) == "diffusiongemma"
    assert family_of(ModelConfig.preset("tiny-llada")).default_preset(ModelConfig.preset("tiny-llada")) == "llada"
    assert family_of(ModelConfig.preset("tiny-qwen2")).default_preset(ModelConfig.preset("tiny-qwen2")) == "jacobi"


# -- the failures a new user hit: one line naming the setting and what to do ------------------------

def _one_line_error(capsys, *argv) -> str:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_diffusiongemma_preset_on_another_model_is_one_line(capsys):
    line = _one_line_error(capsys, "generate", "--model", "tasks-llada-small", "--preset", "diffusiongemma",
                           "--prompt", "reverse 4821=")
    assert "policy 'diffusiongemma' decodes DiffusionGemma models" in line and "'llada'" in line, line
    assert "leave --preset out" in line, line


def test_a_gen_length_that_is_no_whole_canvas_is_one_line(capsys):
    line = _one_line_error(capsys, "generate", "--model", "tasks-diffusiongemma-tiny", "--gen-length", "20",
                           "--prompt", "reverse 4821=")
    assert "gen_length (20) must be a multiple of the canvas length block_length (16)" in line, line
    assert "use gen_length 16 or 32" in line, line


def test_a_requested_gen_length_keeps_the_models_canvas():
    config = sampler_defaults("tasks-diffusiongemma-tiny", gen_length=32)
    assert (config.gen_length, config.block_length) == (32, 16)


def test_a_canvas_other_than_the_models_is_refused_before_decoding():
    from jaxdllm.decoding import generate

    model = Transformer(ModelConfig.preset("tiny-diffusiongemma"), rngs=nnx.Rngs(0))  # canvas 8
    config = SamplerConfig.preset("diffusiongemma", gen_length=12, block_length=12, sample=False)
    with pytest.raises(ConfigError, match=r"denoises canvases of exactly 8 tokens .* set gen_length to a multiple "
                                          r"of 8 \(e\.g\. 16\) and block_length to 8"):
        generate(model, jnp.ones((1, 3), jnp.int32), config)
