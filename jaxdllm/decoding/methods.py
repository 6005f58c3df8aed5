"""Which canvas a policy decodes: `Policy.method` names one of these; the loop runs any of them."""

from __future__ import annotations

from jaxdllm.decoding.masked_canvas import DIFFUSION
from jaxdllm.decoding.draft_canvas import DRAFT

METHODS = {DIFFUSION.name: DIFFUSION, DRAFT.name: DRAFT}


def method_of(config):
    """The decoding method of `config.policy`."""
    return METHODS[config.policy.method]
