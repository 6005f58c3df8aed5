"""How often the student, during distillation, writes the teacher's answer to a training prompt.

For a student trained on its teacher's answers (`[data] source = "teacher"`), agreement with those
answers on the prompts it trains on is the first sign that it is learning anything: a student
that cannot reproduce the teacher's choices has nothing to become certain of. `[log]
agreement_every = N` decodes the first `agreement_prompts` kept teacher answers' prompts every N
steps (and at step 0, before any update) and logs:

- `teacher_agreement`: share of prompts where the student, decoding with the teacher's own
  sampler, writes exactly the teacher's answer; `teacher_sampler_nfe`: its mean forwards;
- with `[log] agreement_fast = {preset = "dparallel", ...}`, `fast_agreement` and `fast_nfe`: the
  same under a parallel sampler, i.e. whether the teacher's answer survives committing many
  tokens per forward and at what cost.

Decoding runs outside the compiled train step, on the model with adapters applied; each sampler
compiles its loop once per run.
"""

from __future__ import annotations

import numpy as np

from jaxdllm.decoding import SamplerConfig
from jaxdllm.errors import ConfigError
from jaxdllm.eval.runner import decode_rows
from jaxdllm.tokenizer import Tokenizer
from jaxdllm.train.distill.teacher import encode_prompt, read_answers


class TeacherAgreement:
    """Agreement of a model's answers with the teacher's on the first `n` training prompts.

    Args:
      prompts, answers: the teacher's training prompts and its (correct) answers, in file order.
      tokenizer: the student's tokenizer.
      samplers: `{metric prefix: SamplerConfig}`; prefix `""` is the teacher's sampler.
      n: prompts to decode (one batch).
      chat_template: wrap prompts in the tokenizer's chat template, as the teacher did.
    """

    def __init__(self, prompts: list[str], answers: list[str], tokenizer: Tokenizer,
                 samplers: dict[str, SamplerConfig], n: int, chat_template: bool = False):
        if not prompts:
            raise ConfigError("[log] agreement_every needs teacher answers to compare with; the file has none")
        self.rows = [encode_prompt(tokenizer, p, chat_template) for p in prompts[:n]]
        self.answers = [a.strip() for a in answers[:n]]
        self.tokenizer = tokenizer
        self.samplers = samplers

    def __call__(self, model) -> dict:
        """`{"teacher_agreement", "teacher_sampler_nfe", ["fast_agreement", "fast_nfe"]}` for `model`."""
        out = {}
        for prefix, config in self.samplers.items():
            responses, nfe, *_ = decode_rows(model, self.tokenizer, self.rows, config)
            agree = float(np.mean([r.strip() == a for r, a in zip(responses, self.answers)]))
            if prefix:
                out.update({f"{prefix}agreement": agree, f"{prefix}nfe": float(np.mean(nfe))})
            else:
                out.update({"teacher_agreement": agree, "teacher_sampler_nfe": float(np.mean(nfe))})
        return out


def agreement_from_recipe(config, tokenizer: Tokenizer) -> TeacherAgreement | None:
    """The `TeacherAgreement` a recipe asks for (`[log] agreement_every > 0`), else None."""
    log = config.log
    if not log.agreement_every:
        return None
    from jaxdllm.pretrained import sampler_defaults
    from jaxdllm.shipped import checkpoint_dir

    if config.data.source != "teacher" or config.distill is None:
        raise ConfigError("[log] agreement_every compares with the teacher's answers: it needs [data] source = "
                          "\"teacher\" and the recipe's [distill] section (the teacher's sampler)")
    teacher = checkpoint_dir(config.distill.teacher or config.model.init_from)
    samplers = {"": sampler_defaults(teacher, config.distill.preset, **config.distill.sampler)}
    if log.agreement_fast:
        fast = dict(log.agreement_fast)
        preset = fast.pop("preset", "dparallel")
        samplers["fast_"] = sampler_defaults(teacher, preset, **{**config.distill.sampler, **fast})
    kept = read_answers(config.teacher_answers)
    return TeacherAgreement([e.prompt for e in kept], [e.response for e in kept], tokenizer, samplers,
                            log.agreement_prompts, chat_template=config.distill.chat_template)
