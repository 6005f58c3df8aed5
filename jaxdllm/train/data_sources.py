"""Where a recipe's training rows come from (`[data] source`): one class per source, in a registry
like policies and objectives, so the trainer names none of them. A new source is one
`DataSource` subclass plus one `register_data_source` call.

A source turns the recipe into a `BatchIterator`: most read `Example`s (prompt, response) and
let `jaxdllm.data` tokenize and batch them; `trajectories` lays out its own packed rows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxdllm.data import (BatchConfig, BatchIterator, JsonlConfig, SpecialIds, load_gsm8k, make_batch_iterator,
                          make_mixture, read_jsonl)
from jaxdllm.data.records import Example
from jaxdllm.data.tasks import get_task
from jaxdllm.errors import ConfigError
from jaxdllm.registry import Registry
from jaxdllm.tokenizer import Tokenizer, special_token_ids


class DataSource:
    """Base class: subclasses set `name` and define `examples` (or `batches`).

    Class attributes:
      name: the recipe's `[data] source`.
      needs_path: `[data] path` must name the input file.
      distill_command: the `jaxdllm distill` command that writes that file; such a source may
        read it from the recipe's `[distill] out` instead of `[data] path`.
      packed_layout: rows arrive laid out whole (no EOS fill after an example).
      pad_rows: each example's row ends in PAD after its EOS, never EOS filler (GenMol's collator).
      trajectories: rows are Jacobi trajectories (only objectives that train on them accept it).
    """

    name: ClassVar[str] = ""
    needs_path: ClassVar[bool] = False
    distill_command: ClassVar[str | None] = None
    packed_layout: ClassVar[bool] = False
    pad_rows: ClassVar[bool] = False
    trajectories: ClassVar[bool] = False

    def check(self, data) -> None:
        """Raise `ConfigError` if the `[data]` section cannot feed this source (at load time)."""
        if self.needs_path and self.distill_command is None and data.path is None:
            raise ConfigError(f"[data] source = {self.name!r} needs path = \"FILE\"")

    def examples(self, data, inputs: str | None) -> list[Example]:
        """The `[data]` section's examples; `inputs` is the file a distillation wrote, if any."""
        raise NotImplementedError

    def files_beside_export(self, data) -> list:
        """Files of the data that an exported model needs beside its weights (`Path`s; default none)."""
        return []

    def batches(self, config, tokenizer: Tokenizer, objective, batch_config: BatchConfig,
                state: dict | None = None) -> BatchIterator:
        """The recipe's batch iterator (resumed from `state`); prompts wrapped in the chat template
        when `[data] chat_template`."""
        examples = self.examples(config.data, config.teacher_answers)
        if config.data.chat_template:
            examples = [dataclasses.replace(e, prompt=tokenizer.apply_chat_template(
                [{"role": "user", "content": e.prompt}], add_generation_prompt=True)) for e in examples]
        return make_batch_iterator(examples, tokenizer, batch_config, state)


class TaskMixture(DataSource):
    name = "tasks"

    def check(self, data):
        if not data.tasks:
            raise ConfigError("[data] tasks is empty: name one or more tasks")
        for task in data.tasks:
            get_task(task)  # an unknown name lists the registered tasks

    def examples(self, data, inputs):
        return make_mixture(data.tasks, data.examples_per_task, data.seed, split=data.split)


class Gsm8k(DataSource):
    name = "gsm8k"

    def examples(self, data, inputs):
        return load_gsm8k(split=data.split, path=data.path)


class Jsonl(DataSource):
    name = "jsonl"
    needs_path = True

    def examples(self, data, inputs):
        return read_jsonl(data.path, JsonlConfig(on_error=data.on_error)).records


class TeacherAnswers(DataSource):
    """A `jaxdllm distill generate` output: the teacher's checked answers (dParallel)."""

    name = "teacher"
    needs_path = True
    distill_command = "generate"

    def examples(self, data, inputs):
        from jaxdllm.train.distill import read_answers

        return read_answers(inputs or data.path, data.keep)


class Trajectories(DataSource):
    """A `jaxdllm distill trajectories` output: each row packs one Jacobi trajectory as the
    objective lays it out (Jacobi Forcing, CLLM)."""

    name = "trajectories"
    needs_path = True
    distill_command = "trajectories"
    packed_layout = True
    trajectories = True

    def batches(self, config, tokenizer, objective, batch_config, state=None):
        from jaxdllm.train.distill.trajectories import fit_rows, read_trajectories, trajectory_examples

        rows = trajectory_examples(read_trajectories(config.teacher_answers, config.data.keep),
                                   objective.block_length, selection=objective.trajectory_selection,
                                   eos_id=special_token_ids(tokenizer)["eos_token_id"], window=config.data.window,
                                   shift_schedule=config.data.shift_schedule, seed=config.data.seed)
        return BatchIterator(fit_rows(rows, batch_config), batch_config,
                             SpecialIds.from_tokenizer(tokenizer, batch_config), state)


class MultiverseCurriculum(DataSource):
    """Multiverse's AR-to-Multiverse curriculum over the `parts` task (`jaxdllm.data.parts_task.curriculum`):
    `[data] tasks = ["parts"]`, `examples_per_task` instances, 8 rows per instance, read in order (the
    published trainer's sequential sampler: no shuffle, the stages follow each other)."""

    name = "multiverse_curriculum"
    multiverse: ClassVar[bool] = True

    def check(self, data):
        from jaxdllm.data.parts_task import PartsTask

        if len(data.tasks) != 1 or not isinstance(get_task(data.tasks[0]), PartsTask):
            raise ConfigError(f"[data] source = {self.name!r} takes tasks = [\"parts\"] (one PartsTask), "
                              f"got {list(data.tasks)}")

    def examples(self, data, inputs):
        from jaxdllm.data.parts_task import curriculum

        return curriculum(get_task(data.tasks[0]), data.examples_per_task, data.seed, multiverse=self.multiverse)

    def batches(self, config, tokenizer, objective, batch_config, state=None):
        return super().batches(config, tokenizer, objective, dataclasses.replace(batch_config, shuffle=False), state)


class SequentialCurriculum(MultiverseCurriculum):
    """The AR baseline of `multiverse_curriculum`: the same prompts, order and rows, every response in
    the sequential (tag-free) format."""

    name = "sequential_curriculum"
    multiverse = False


class SafeMolecules(DataSource):
    """Molecules as SAFE strings (GenMol): `[data] path` is a folder `jaxdllm.molecules.moses.prepare`
    wrote (its `{split}.tsv.gz`) or one such file; each row is `[CLS] SAFE [SEP]` then PAD, all of it
    scored (the recipe's tokenizer is the folder's `tokenizer/`)."""

    name = "safe_molecules"
    needs_path = True
    pad_rows = True

    def examples(self, data, inputs):
        from pathlib import Path

        from jaxdllm.molecules.moses import read_pairs

        path = Path(data.path)
        file = path / f"{data.split}.tsv.gz" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"[data] path {data.path!r}: no {file.name} (write the folder with "
                              "`python -m jaxdllm.molecules.moses --out DIR`)")
        return [Example(prompt="", response=safe, task="molecule") for _, safe in read_pairs(file)]

    def files_beside_export(self, data):
        """The folder's `lengths.json` (GenMol's sampler draws each molecule's length from it) and
        `safe_format.json` (how its strings write attachments), which `jaxdllm.molecules.Designer.load`
        reads beside the weights."""
        from pathlib import Path

        from jaxdllm.molecules.bracket_safe import FORMAT_FILE
        from jaxdllm.molecules.moses import LENGTHS_FILE

        path = Path(data.path)
        folder = path if path.is_dir() else path.parent
        return [folder / name for name in (LENGTHS_FILE, FORMAT_FILE) if (folder / name).is_file()]


DATA_SOURCES: Registry[DataSource] = Registry("[data] source")
register_data_source = DATA_SOURCES.register  # makes `cls` selectable as [data] source = cls.name
data_source = DATA_SOURCES.lookup

for _cls in (TaskMixture, Jsonl, Gsm8k, TeacherAnswers, Trajectories, MultiverseCurriculum, SequentialCurriculum,
             SafeMolecules):
    register_data_source(_cls)
