"""The canvas registry: a canvas is checked against the `Canvas` base when it is registered, a policy
against its canvas's `policy_base` when a `SamplerConfig` is built, and callers ask a canvas instead of
comparing names."""

import ast
import dataclasses
from pathlib import Path

import pytest

from jaxdllm import SamplerConfig
from jaxdllm.decoding.canvas import Canvas, CanvasRegistry
from jaxdllm.decoding.canvases import CANVASES, canvas_of
from jaxdllm.decoding.masked_canvas import MaskedCanvas
from jaxdllm.decoding.policies import Policy
from jaxdllm.decoding.policies.draft_verify import DraftVerifyPolicy
from jaxdllm.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "jaxdllm"


def test_a_canvas_missing_a_hook_is_refused_at_registration():
    class HalfCanvas(Canvas):
        name = "half_canvas"

        def check_config(self, config):
            pass

    registry = CanvasRegistry("canvas")
    with pytest.raises(ConfigError, match="canvas HalfCanvas does not define check_model, footprint, init, "
                                          "max_steps, step"):
        registry.register(HalfCanvas)
    with pytest.raises(ConfigError, match="is not a Canvas subclass"):
        registry.register(dict)
    assert "half_canvas" not in registry


def test_a_subclass_of_a_registered_canvas_registers_under_its_own_name():
    class WiderCanvas(MaskedCanvas):
        name = "wider_canvas"

    registry = CanvasRegistry("canvas")
    registry.register(WiderCanvas)
    assert registry.lookup("wider_canvas") is WiderCanvas
    assert WiderCanvas() == WiderCanvas() and WiderCanvas() != MaskedCanvas()  # a static argument of the loop
    assert hash(WiderCanvas()) == hash(WiderCanvas())


def test_a_policy_must_derive_from_its_canvas_policy_base():
    @dataclasses.dataclass(frozen=True)
    class CommitsOnADraft(Policy):  # names the draft canvas but has no propose / accept
        name = "commits_on_a_draft"
        canvas = "draft_canvas"

    with pytest.raises(ConfigError, match="policy 'commits_on_a_draft' decodes on canvas 'draft_canvas', whose "
                                          "policies derive from DraftVerifyPolicy"):
        SamplerConfig(policy=CommitsOnADraft(), gen_length=8)

    @dataclasses.dataclass(frozen=True)
    class Nowhere(Policy):
        name = "nowhere"
        canvas = "no_such_canvas"

    with pytest.raises(ConfigError, match="canvas must be one of"):
        SamplerConfig(policy=Nowhere(), gen_length=8, block_length=4)


def test_every_preset_names_a_registered_canvas_that_takes_its_policy():
    from jaxdllm.decoding.config import SAMPLER_PRESETS
    for name, config in SAMPLER_PRESETS.items():
        canvas = canvas_of(config)
        assert type(canvas) is CANVASES[config.policy.canvas], name
        assert isinstance(config.policy, canvas.policy_base), name
    assert isinstance(SAMPLER_PRESETS["jacobi"].policy, DraftVerifyPolicy)


def test_resizing_asks_the_canvas():
    """A diffusion block becomes the largest divisor of the new length up to the published block; one
    block over the canvas stays one block; a canvas without blocks keeps the loop's default (Jacobi's
    window, the policy's own setting, stays the published one, at most the canvas)."""
    assert SamplerConfig.preset("jacobi", gen_length=48).block_length == 128
    assert SamplerConfig.preset("jacobi", gen_length=8).window == 8
    assert SamplerConfig.preset("llada", gen_length=48).block_length == 24
    assert SamplerConfig.preset("dream", gen_length=48).block_length == 48


def _compared_names(tree: ast.AST) -> list[str]:
    """`<x>.name == "<string>"` / `!=` / `in (...)` comparisons and `.canvas == "<string>"` ones."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and (s.attr in ("canvas", "method") or s.attr == "name" and
                        isinstance(s.value, ast.Attribute) and s.value.attr in ("cache", "canvas", "policy"))
                        for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) or
                          isinstance(s, (ast.Tuple, ast.List, ast.Set)) and s.elts and
                          all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)
                          for s in sides)
            if named and literal:
                hits.append(ast.unparse(node))
    return hits


def test_no_module_compares_canvas_or_cache_names():
    """Callers ask a canvas or a cache (`footprint`, `step_window`, `exact`, ...) instead of testing its name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = _compared_names(ast.parse(path.read_text()))
        if hits:
            found[str(path.relative_to(PACKAGE.parent))] = hits
    assert not found, found


def test_each_short_spelling_has_one_owner(monkeypatch):
    """Presets and --set spell settings flat; a policy registered with a setting named like a cache's (or
    a loop setting) is refused, naming both owners."""
    from jaxdllm.decoding import policies
    from jaxdllm.decoding.config import setting_owners

    table = setting_owners()
    assert table["threshold"][0] == "policy" and table["gen_length"] == ("loop", "the loop")
    assert table["refresh_every_step"][0] == table["cache_refresh_every_step"][0] == "cache"

    @dataclasses.dataclass(frozen=True)
    class Refreshing(Policy):
        refresh_every_step: bool = False
        name = "refreshing"

    monkeypatch.setitem(policies.POLICIES, "refreshing", Refreshing)
    with pytest.raises(ConfigError, match="sampler setting 'refresh_every_step' belongs to cache 'prefix' and to "
                                          "policy 'refreshing'|belongs to policy 'refreshing' and to cache"):
        SamplerConfig(policy="llada", gen_length=8, block_length=8, steps=8)


def test_a_second_model_is_passed_by_its_role():
    """`companions={role: model}` names the policy's second model; a wrong role, a policy without one, or
    the model given twice is one error naming the role."""
    from jaxdllm.decoding.sampler import second_model

    apd, llada = SamplerConfig.preset("apd", gen_length=16), SamplerConfig.preset("llada", gen_length=16)
    verifier = object()
    assert second_model(apd, None, {"verifier": verifier}) is verifier
    assert second_model(apd, verifier, None) is verifier
    with pytest.raises(ConfigError, match=r"policy 'apd' runs a verifier: pass companions=\{'verifier': model\}, "
                                          r"got 'drafter'"):
        second_model(apd, None, {"drafter": verifier})
    with pytest.raises(ConfigError, match="policy 'llada' runs no second model: drop companions="):
        second_model(llada, None, {"verifier": verifier})
    with pytest.raises(ConfigError, match="given twice"):
        second_model(apd, verifier, {"verifier": verifier})
    assert SamplerConfig.preset("specdiff").policy.companion == "drafter"
