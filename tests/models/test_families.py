"""The contract every registered model family keeps (`jaxdllm.models.families.FAMILIES`): its tiny
presets' config.json round-trips, its tensor table covers exactly the `Transformer`'s parameters,
its presets are its own, and no two families claim one model_type."""

import math

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from jaxdllm import ConfigError, ModelConfig, RunOptions, Transformer, save_pretrained
from jaxdllm.checkpoint import config_from_hf, config_to_hf
from jaxdllm.checkpoint.hf_io import device_tensors
from jaxdllm.checkpoint.hf_names import param_location, tensor_table
from jaxdllm.models.config import CHECKPOINT_PRESETS, PRESETS
from jaxdllm.models.families import FAMILIES, SUPPORTED_MODEL_TYPES, family_for_hf, family_of

TINY = [pytest.param(family, name, id=name) for family in FAMILIES for name in family.presets
        if name.startswith("tiny-")]
ALL = [pytest.param(family, name, id=name) for family in FAMILIES for name in family.presets]


def test_every_family_has_a_tiny_preset():
    assert all(any(name.startswith("tiny-") for name in family.presets) for family in FAMILIES)


def test_model_types_and_names_are_unique_and_supported():
    types = [t for family in FAMILIES for t in family.model_types]
    assert len(types) == len(set(types)) and set(types) == set(SUPPORTED_MODEL_TYPES)
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)
    assert all(t == t.lower() for t in types)  # config.json model_types are matched lower case


def test_the_presets_are_the_families_presets():
    assert PRESETS == {name: c for family in FAMILIES for name, c in family.presets.items()}
    assert CHECKPOINT_PRESETS == {k: v for family in FAMILIES for k, v in family.checkpoints.items()}
    for family in FAMILIES:
        assert set(family.checkpoints.values()) <= set(family.presets)


@pytest.mark.parametrize("family,name", ALL)
def test_each_preset_belongs_to_its_family(family, name):
    c = family.presets[name]
    assert family_of(c) is family
    assert family_for_hf(config_to_hf(c)) is family  # its config.json reads back through the same family
    assert c.model_type.lower() in SUPPORTED_MODEL_TYPES
    assert c.checkpoint_format == family.checkpoint_format
    if family.model_types:
        assert c.model_type.lower() in family.model_types


@pytest.mark.parametrize("family,name", TINY)
def test_config_json_round_trips(family, name):
    c = family.presets[name]
    raw = config_to_hf(c)
    back = config_from_hf(raw)
    # config.json carries no end-of-turn id; everything else survives
    assert back.replace(eot_token_id=c.eot_token_id) == c
    assert config_to_hf(back) == raw


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scanned"])
@pytest.mark.parametrize("family,name", TINY)
def test_tensor_table_covers_exactly_the_parameters(family, name, scan):
    c = family.presets[name]
    if scan and not c.identical_layers:
        pytest.skip("a model mixing dense and MoE layers cannot scan them")
    model = nnx.eval_shape(lambda: Transformer(c, RunOptions(scan_layers=scan), rngs=nnx.Rngs(0)))
    params = {path: tuple(v.get_value().shape) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    slices: dict[tuple, set] = {}
    rows: dict[str, list] = {}
    for t in family.tensor_table(c):
        path, index = param_location(t, scan)
        assert path in params, f"{t.name} -> {path}: no such parameter"
        assert params[path][len(index):] == t.shape, t.name
        assert index not in slices.setdefault(path, set()), f"{t.name}: {path}{index} mapped twice"
        slices[path].add(index)
        assert math.prod(t.part_shape) == math.prod(t.shape), t.name
        rows.setdefault(t.name, []).append((t.rows, t.hf_shape[t.axis]))
    assert set(slices) == set(params), f"parameters without a tensor: {sorted(set(params) - set(slices))}"
    for path, indices in slices.items():  # a stacked (expert) parameter has every slice
        depth = len(next(iter(indices)))
        assert len(indices) == math.prod(params[path][:depth]), path
    for name, parts in rows.items():  # a tensor is one part, or a fused one whose parts tile its rows in order
        spans = [r for r, _ in parts]
        if spans != [None]:
            assert None not in spans and spans[0][0] == 0 and spans[-1][1] == parts[0][1], name
            assert all(a == b for (_, b), (a, _) in zip(spans, spans[1:])), name
    assert family.tensor_table(c) == tensor_table(c)


def test_a_config_no_family_holds_is_an_error():
    with pytest.raises(ConfigError, match="no model family has checkpoint_format='hf' with model_type='gpt2'"):
        family_of(ModelConfig.preset("tiny-qwen2", model_type="gpt2"))


def test_a_published_checkpoint_name_gives_its_preset():
    assert ModelConfig.preset("inclusionAI/LLaDA2.1-mini") == ModelConfig.preset("llada2-mini")
    assert ModelConfig.preset("GSAI-ML/LLaDA-8B-Instruct", max_position=512).max_position == 512


@pytest.mark.parametrize("family,name", TINY)
def test_device_tensors_are_the_exported_files_tensors(family, name, tmp_path):
    """What `device_tensors` hands to another framework is, name for name and bit for bit, what
    `save_pretrained` writes (fused parts concatenated, linears transposed), in file order."""
    model = Transformer(family.presets[name], RunOptions(scan_layers=family.presets[name].identical_layers),
                        rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path)
    written = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        written.update(load_file(f))
    handed = list(device_tensors(model))
    assert [n for n, _ in handed] == list(dict.fromkeys(t.name for t in tensor_table(model.config)))
    assert {n for n, _ in handed} == set(written)
    for n, x in handed:
        np.testing.assert_array_equal(np.asarray(x), written[n], err_msg=n)
