"""Distillation data: the teacher's checked answers (`teacher`), which `[data] source =
"teacher"` trains on with `[objective] kind = "certainty_forcing"` (dParallel)."""

from jaxdllm.train.distill.teacher import (answer_statistics, check_answer, generate_answers, load_prompts,
                                           read_answers)

__all__ = ["answer_statistics", "check_answer", "generate_answers", "load_prompts", "read_answers"]
