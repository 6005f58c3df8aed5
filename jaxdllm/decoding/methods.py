"""Which canvas a policy decodes: `Policy.method` names one of these; the loop runs any of them."""

from __future__ import annotations

from jaxdllm.decoding.apd_canvas import APD_CANVAS
from jaxdllm.decoding.masked_canvas import MASKED_CANVAS
from jaxdllm.decoding.draft_canvas import DRAFT_CANVAS
from jaxdllm.decoding.freedave_canvas import FREEDAVE_CANVAS
from jaxdllm.decoding.uniform_canvas import UNIFORM_CANVAS

# Each method has one name: its module, its class (in CamelCase) and this key.
METHODS = {MASKED_CANVAS.name: MASKED_CANVAS, DRAFT_CANVAS.name: DRAFT_CANVAS, UNIFORM_CANVAS.name: UNIFORM_CANVAS,
           FREEDAVE_CANVAS.name: FREEDAVE_CANVAS, APD_CANVAS.name: APD_CANVAS}


def method_of(config):
    """The decoding method of `config.policy`."""
    return METHODS[config.policy.method]
