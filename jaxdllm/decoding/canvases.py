"""Canvases by name, like policies and caches: `Policy.canvas` names one of these and the loop runs
any of them. A new canvas is one module with a `Canvas` subclass (`jaxdllm/decoding/canvas.py`) plus
one line in the registration loop below (or a `register_canvas` call from user code)."""

from __future__ import annotations

from jaxdllm.decoding.apd_canvas import ApdCanvas
from jaxdllm.decoding.assd_canvas import AssdCanvas
from jaxdllm.decoding.canvas import Canvas, CanvasRegistry
from jaxdllm.decoding.draft_canvas import DraftCanvas
from jaxdllm.decoding.freedave_canvas import FreedaveCanvas
from jaxdllm.decoding.genmol_canvas import GenmolCanvas
from jaxdllm.decoding.hogwild_canvas import HogwildCanvas
from jaxdllm.decoding.masked_canvas import MaskedCanvas
from jaxdllm.decoding.multiverse_canvas import MultiverseCanvas
from jaxdllm.decoding.uniform_canvas import UniformCanvas
from jaxdllm.decoding.wedlm_canvas import WedlmCanvas

CANVASES: CanvasRegistry = CanvasRegistry("canvas")
register_canvas = CANVASES.register  # checks the class against `Canvas`, then makes it a policy's `canvas`

for _cls in (MaskedCanvas, DraftCanvas, UniformCanvas, FreedaveCanvas, ApdCanvas, WedlmCanvas, AssdCanvas,
             MultiverseCanvas, HogwildCanvas, GenmolCanvas):
    register_canvas(_cls)


def canvas_class(name: str) -> type[Canvas]:
    """The canvas registered as `name` (`ConfigError` listing the known ones otherwise)."""
    return CANVASES.lookup(name)


def canvas_of(config) -> Canvas:
    """The canvas `config.policy` decodes on (`SamplerConfig` or a policy)."""
    policy = getattr(config, "policy", config)
    return canvas_class(policy.canvas)()
