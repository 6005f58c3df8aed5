"""Hogwild!'s texts (Rodionov et al. 2025, `formatting.py`; `assd-hogwild-multiverse.md` §2c-2d) and their ids
for a tokenizer: the collaboration prompt, the blocks' headers, each worker's step header, the redundancy
check, the finisher, and the published step-end rule as id sets for the compiled loop.

    fmt = HogwildFormat(workers=2)
    config = SamplerConfig(gen_length=512, policy="hogwild", **settings_for(tokenizer, fmt))
    texts = hogwild_generate(model, tokenizer, ["What is 17 * 23?"], config, fmt)   # jaxdllm.decoding.hogwild_run

The prompt template is the published structure in this project's words (a user passes their own with
`template=`): a "# Collaborative Reasoning" header, the rules (write at once, see the others' unfinished
thoughts first and your own after "### Work in progress (own)", switch tasks instead of duplicating, any
worker may give the final `\\boxed{}` answer), the collaboration suggestions, the first worker's version on
disagreement, and the problem.
"""

from __future__ import annotations

import dataclasses

from jaxdllm.errors import ConfigError

SENTENCE_END = (".", "?", "!", "。", "۔", "؟", "।", "॥", "…", "‽", "།", "᠃", "։", "჻", "¶", "❧")
NAMES = ("Alice", "Bob", "Carol", "Dave")

TEMPLATE = """# Collaborative Reasoning

You are {names}: {count} assistants solving the problem below together, each writing at the same time as the \
others. You see the others' unfinished thoughts first, under "### Work in progress (others)", then your own \
current step, under "### Work in progress (own)". Finished steps of everyone are under "### Past steps".

Rules:
- Do not repeat work: if another assistant already did or is doing what you are doing, stop and pick a \
different part of the problem at once.
- Strategize and split the work early; try alternatives in parallel; say what you are about to do; react to \
what the others found; pivot when a line of attack fails.
- If you disagree, check both versions; when in doubt, keep {first}'s.
- Any of you may give the final answer, as \\boxed{{answer}}.

{names}, solve this problem together. Keep track of who does what.

Problem: {problem}"""


@dataclasses.dataclass(frozen=True)
class HogwildFormat:
    """The texts of a Hogwild! run.

    Attributes:
      workers: 2-4; `names` their names (the first `workers` are used).
      template: the collaboration prompt, a `str.format` template with `{problem}`, `{names}`, `{count}`,
        `{first}`.
      past_steps, others_header, own_header: the block texts after the prompt, before the others' steps,
        before a worker's own step.
      step_header: "**{name} [{k}]:** ", a new step's opening (k: the worker's step number).
      greetings: each worker's first words after its first header.
      check_text, check_every: the redundancy check opening a step once a worker wrote more than
        `check_every` tokens since its last one (256 in the published main branch, 1024 in `inference_lib`).
      finisher_text, finisher_tokens: what follows the flattened state when the budget ends without an
        answer, and how many tokens are then decoded greedily.
      suppress: single-token texts never chosen, besides BOS (the published main branch suppresses "#", BOS,
        EOS and "</think>"; here EOS ends a problem, as in the published `inference_lib`).
    """

    workers: int = 2
    names: tuple[str, ...] = NAMES
    template: str = TEMPLATE
    past_steps: str = "\n### Past steps\n\n"
    others_header: str = "\n\n### Work in progress (others)\n\n"
    own_header: str = "<...>\n\n### Work in progress (own)\n\n"
    step_header: str = "**{name} [{k}]:** "
    greetings: tuple[str, ...] = ("Hi, I'm Alice. Here's how we can", "Hi, I'm Bob.", "Hi, I'm Carol.",
                                  "Hi, I'm Dave.")
    check_text: str = "Quick check: am I doing redundant work? (yes/no): "
    check_every: int = 256
    finisher_text: str = ("<...>\n\nWait, given the limited time, I have to give an answer right now. Considering all "
                          "my previous attempts, I have to conclude that the final answer is \\boxed{")
    finisher_tokens: int = 16
    suppress: tuple[str, ...] = ("#", "</think>")

    def __post_init__(self):
        if not isinstance(self.workers, int) or not 2 <= self.workers <= 4:
            raise ConfigError(f"workers must be 2, 3 or 4, got {self.workers!r}")
        if len(self.names) < self.workers or len(self.greetings) < self.workers:
            raise ConfigError(f"names and greetings need {self.workers} entries (one per worker)")
        if "{k}" not in self.step_header or "{name}" not in self.step_header:
            raise ConfigError(f"step_header must hold {{name}} and {{k}}, got {self.step_header!r}")
        if "{problem}" not in self.template:
            raise ConfigError("the template must hold {problem}")
        if self.check_every < 1 or self.finisher_tokens < 1:
            raise ConfigError("check_every and finisher_tokens must be >= 1")

    def prompt(self, problem: str) -> str:
        """The common block's text for `problem`: the filled template, then the past-steps header."""
        names = list(self.names[:self.workers])
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        return self.template.format(problem=problem, names=listed, count=self.workers, first=names[0]) + self.past_steps

    def first_step(self, worker: int) -> str:
        return self.step_header.format(name=self.names[worker], k=1) + self.greetings[worker]


def _one_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(f"{text!r} is {len(ids)} tokens in this tokenizer; Hogwild!'s step headers need each "
                          "digit to be one token")
    return int(ids[0])


def step_end_sets(tokenizer) -> dict:
    """The step-end rule's id sets (`jaxdllm.decoding.policies.hogwild.Hogwild`) for every id of `tokenizer`'s
    vocabulary, each decoded alone."""
    texts = tokenizer.backend.decode_batch([[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=False)
    sets = {name: [] for name in ("break_ids", "break_sentence_ids", "break_leading_ids", "newline_start_ids",
                                  "newline_end_ids", "newline_only_ids", "sentence_end_ids", "sentence_newline_ids")}
    for i, text in enumerate(texts):
        if "\n\n" in text:
            sets["break_ids"].append(i)
            before = text[:text.rfind("\n\n")]
            if before.endswith(SENTENCE_END):
                sets["break_sentence_ids"].append(i)
            if before == "":
                sets["break_leading_ids"].append(i)
        if text.startswith("\n"):
            sets["newline_start_ids"].append(i)
        if text.endswith("\n"):
            sets["newline_end_ids"].append(i)
            if text[:-1].endswith(SENTENCE_END):
                sets["sentence_newline_ids"].append(i)
        if text == "\n":
            sets["newline_only_ids"].append(i)
        if text.endswith(SENTENCE_END):
            sets["sentence_end_ids"].append(i)
    return {name: tuple(ids) for name, ids in sets.items()}


def settings_for(tokenizer, fmt: HogwildFormat = HogwildFormat()) -> dict:
    """`Hogwild` policy settings for `tokenizer` (a `jaxdllm.Tokenizer`) and `fmt`: every text pre-tokenized,
    the step-end id sets and the suppressed ids. Raises `ConfigError` when a step header does not tokenize as
    its prefix + the step number's digits + its suffix (a tokenizer merging across them)."""
    enc = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    marker = "\x00"
    prefix_t, suffix_t = fmt.step_header.replace("{k}", marker).split(marker, 1)
    digits = tuple(_one_token(tokenizer, str(d)) for d in range(10))
    prefixes = tuple(enc(prefix_t.format(name=fmt.names[w])) for w in range(fmt.workers))
    suffix = enc(suffix_t)
    for w in range(fmt.workers):
        for k in (1, 9, 10, 123):
            whole = enc(fmt.step_header.format(name=fmt.names[w], k=k))
            parts = prefixes[w] + tuple(digits[int(c)] for c in str(k)) + suffix
            if whole != parts:
                raise ConfigError(f"the step header {fmt.step_header.format(name=fmt.names[w], k=k)!r} tokenizes as "
                                  f"{whole}, not its prefix + digits + suffix {parts}: choose a step_header whose "
                                  "number is set apart (e.g. by spaces or brackets) in this tokenizer")
    # BOS and fmt's texts are never chosen; EOS ends a problem (the published inference_lib loop)
    bos = tokenizer.special_tokens.get("bos_token")
    suppress = [i for text in fmt.suppress + ((bos,) if bos else ()) for i in [tokenizer.token_to_id(text)]
                if i is not None]
    return dict(workers=fmt.workers, first_steps=tuple(enc(fmt.first_step(w)) for w in range(fmt.workers)),
                header_prefixes=prefixes, header_suffix=suffix, digit_ids=digits,
                others_header=enc(fmt.others_header), own_header=enc(fmt.own_header), check_ids=enc(fmt.check_text),
                check_every=fmt.check_every, finisher_ids=enc(fmt.finisher_text), finisher_tokens=fmt.finisher_tokens,
                suppress_ids=tuple(sorted(set(suppress))), **step_end_sets(tokenizer))
