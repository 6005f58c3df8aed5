"""Which canvas a policy decodes: `Policy.method` names one of these; the loop runs any of them."""

from __future__ import annotations

from jaxdllm.decoding.masked_canvas import DIFFUSION
from jaxdllm.decoding.draft_canvas import JACOBI

METHODS = {DIFFUSION.name: DIFFUSION, JACOBI.name: JACOBI}


def method_of(config):
    """The decoding method of `config.policy`."""
    return METHODS[config.policy.method]
