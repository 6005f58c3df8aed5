"""A Hogwild! run from problems to texts: each problem put in the collaboration prompt
(`jaxdllm.decoding.hogwild_text.HogwildFormat`), decoded by the one loop (`policy="hogwild"`), the answer
read back."""

from __future__ import annotations

import numpy as np

from jaxdllm.decoding.hogwild_text import HogwildFormat
from jaxdllm.decoding.sampler import generate


def hogwild_generate(model, tokenizer, problems: list[str], config, fmt: HogwildFormat = HogwildFormat(), *,
                     key=None) -> list[str]:
    """Each problem's text after a Hogwild! run of `config` (a `SamplerConfig` with `policy="hogwild"` and
    `settings_for(tokenizer, fmt)`): the finished steps, each worker's last step, the finisher's answer."""
    batch = tokenizer([fmt.prompt(p) for p in problems])
    out = generate(model, batch.ids, config, attention_mask=batch.mask, key=key)
    eos = tokenizer.token_to_id(tokenizer.special_tokens.get("eos_token", "")) if tokenizer.special_tokens else None
    texts = []
    for row in np.asarray(out.generated):
        ids = row.tolist()
        ids = ids[:ids.index(eos)] if eos is not None and eos in ids else ids
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts
