"""Prompt/response examples -> fixed-length token batches, shuffled deterministically and resumably.

`tokenize_examples` turns `Example`s into `TokenizedExample`s: `[BOS] prompt response [EOS]` ids
and the prompt length (BOS included). `BatchIterator` lays them out in rows of `seq_len` tokens
and yields batches of numpy arrays (a dict; every array `[rows, seq_len]`):

- `tokens` int32: the ids.
- `prompt_mask` bool: BOS and prompt tokens; SFT keeps these clean and never scores them.
- `target_mask` bool: response tokens and their EOS (with `fill_with_eos`, also the EOS filling
  the rest of the row, as in LLaDA SFT, so the model learns where the answer ends). The SFT
  loss is normalised per example by the number of target tokens of its segment.
- `segment_ids` int32: 1, 2, ... per example in the row (packing puts several in one row),
  0 on padding, the convention of `jaxdllm.MaskSpec` (`q_segment_ids` / `kv_segment_ids`).
- `positions` int32: token positions restarting at 0 in each segment (0 on padding).

Without packing each row holds one example followed by EOS fill (`fill_with_eos`, default) or
PAD. With `pack=True` rows hold consecutive examples of the shuffled stream while they fit,
then PAD (segment 0); an example never spans two rows.

Order and resumption: epoch `e` visits the examples in `permutation(seed, e)` (numpy PCG64,
seeded with `[seed, e]`), and rows stream on across epochs (a batch may end one epoch and start
the next). The whole iterator state is `{"epoch", "position"}` (the next example of that
epoch's order) plus the seed and dataset size as a check; `get_state()` after a batch and
`set_state()` on a fresh iterator yield exactly the batches that would have followed. Packing is
greedy from the current position, so it resumes exactly too. With several processes
(`num_shards`), every process builds the same global batch and keeps its `shard_index`-th slice
of rows.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Iterator, Literal, Sequence

import numpy as np

from jaxdllm.data.records import Example
from jaxdllm.errors import ConfigError, DataError
from jaxdllm.validation import check_fields, require_positive_int
from jaxdllm.tokenizer import Tokenizer, special_token_ids

BATCH_KEYS = ("tokens", "prompt_mask", "target_mask", "segment_ids", "positions")


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How examples become batches.

    Attributes:
      seq_len: tokens per row.
      batch_size: rows per global batch (all shards together).
      seed: shuffling seed (non-negative).
      shuffle: a new random order every epoch (False: file order every epoch).
      pack: several examples per row, separated by segment ids.
      add_bos, add_eos: put BOS before the prompt / EOS after the response.
      fill_with_eos: (no packing) fill each row after its EOS with EOS targets, LLaDA-SFT
        style; False fills with PAD outside every mask.
      align: (packing) each example starts at a multiple of this column. Block-causal models
        use their block size, so an example's blocks sit at absolute positions from its own start,
        the layout they decode in (`jaxdllm.decoding.layout`).
      on_too_long: an example longer than `seq_len`: `"error"` (default) or `"skip"` (warn, count).
      num_epochs: stop after this many passes (the last batch is padded with empty rows);
        None streams forever.
      num_shards, shard_index: this process's slice of each global batch (multi-host).
    """

    seq_len: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    pack: bool = False
    add_bos: bool = True
    add_eos: bool = True
    fill_with_eos: bool = True
    align: int = 1
    on_too_long: Literal["error", "skip"] = "error"
    num_epochs: int | None = None
    num_shards: int = 1
    shard_index: int = 0

    def __post_init__(self):
        check_fields(self, "BatchConfig.")
        for name in ("seq_len", "batch_size", "num_shards", "align"):
            require_positive_int(getattr(self, name), f"BatchConfig.{name}")
        if self.seq_len < 2:
            raise ConfigError(f"BatchConfig.seq_len must be at least 2, got {self.seq_len}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"BatchConfig.seed must be a non-negative integer, got {self.seed!r}")
        if self.on_too_long not in ("error", "skip"):
            raise ConfigError(f"BatchConfig.on_too_long must be 'error' or 'skip', got {self.on_too_long!r}")
        if self.num_epochs is not None:
            require_positive_int(self.num_epochs, "BatchConfig.num_epochs (or None)")
        if self.batch_size % self.num_shards:
            raise ConfigError(f"BatchConfig.batch_size ({self.batch_size}) must be a multiple of "
                              f"num_shards ({self.num_shards}): every shard gets the same number of rows")
        if not 0 <= self.shard_index < self.num_shards:
            raise ConfigError(f"BatchConfig.shard_index must be in [0, {self.num_shards}), got {self.shard_index}")
        if self.pack and self.fill_with_eos:
            raise ConfigError("BatchConfig: pack=True leaves PAD after the last example of a row; "
                              "set fill_with_eos=False with packing")
        if self.fill_with_eos and not self.add_eos:
            raise ConfigError("BatchConfig: fill_with_eos=True needs add_eos=True")

    @property
    def rows_per_shard(self) -> int:
        return self.batch_size // self.num_shards


@dataclasses.dataclass(frozen=True)
class TokenizedExample:
    """`ids` = `[BOS] prompt response [EOS]` (int32); the first `prompt_len` ids are BOS + prompt.
    `positions` (int32, like `ids`): position ids when they are not `0, 1, ...` (packed layouts
    such as Jacobi Forcing's, where two blocks share positions)."""

    ids: np.ndarray
    prompt_len: int
    positions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The ids batching writes: PAD always, BOS/EOS where the config asks for them."""

    pad: int
    bos: int | None
    eos: int | None

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, config: BatchConfig) -> "SpecialIds":
        ids = special_token_ids(tokenizer)
        for flag, key in (("add_bos", "bos_token_id"), ("add_eos", "eos_token_id")):
            if getattr(config, flag) and ids[key] is None:
                raise DataError(f"BatchConfig.{flag}=True but the tokenizer names no "
                                f"{key[:-3]} in tokenizer_config.json; set {flag}=False or add it")
        pad = ids["pad_token_id"] if ids["pad_token_id"] is not None else ids["eos_token_id"]
        if pad is None:
            raise DataError("the tokenizer names neither a pad_token nor an eos_token to pad with")
        return cls(pad=pad, bos=ids["bos_token_id"], eos=ids["eos_token_id"])


def _unknown_chars(tokenizer: Tokenizer, text: str) -> list[str]:
    return sorted({c for _, c in tokenizer.unknown_characters(text)})


def tokenize_examples(examples: Sequence[Example], tokenizer: Tokenizer, config: BatchConfig,
                      ) -> list[TokenizedExample]:
    """Tokenise `examples` for `config` (BOS/EOS, length limit); see `BatchConfig.on_too_long`.

    A prompt or response with characters the tokenizer maps to its unknown token raises
    `DataError` naming the example and the characters.
    """
    special = SpecialIds.from_tokenizer(tokenizer, config)
    unk = tokenizer.special_tokens.get("unk_token")
    unk_id = tokenizer.token_to_id(unk) if unk else None
    prompts = tokenizer.encode_batch([e.prompt for e in examples], add_special_tokens=False)
    responses = tokenizer.encode_batch([e.response for e in examples], add_special_tokens=False)
    head = [special.bos] if config.add_bos else []
    tail = [special.eos] if config.add_eos else []
    out, too_long = [], []
    for index, (example, p, r) in enumerate(zip(examples, prompts, responses)):
        if unk_id is not None and (unk_id in p or unk_id in r):
            chars = _unknown_chars(tokenizer, example.prompt + example.response)
            raise DataError(f"example {index} (task {example.task!r}) has characters the tokenizer "
                            f"does not know: {chars}")
        ids = head + p + r + tail
        if len(ids) > config.seq_len:
            if config.on_too_long == "error":
                raise DataError(
                    f"example {index} (task {example.task!r}) is {len(ids)} tokens (prompt {len(p)}, "
                    f"response {len(r)}, plus BOS/EOS), more than seq_len={config.seq_len}; raise "
                    "seq_len or set BatchConfig(on_too_long='skip')")
            too_long.append(index)
            continue
        out.append(TokenizedExample(np.asarray(ids, np.int32), len(head) + len(p)))
    if too_long:
        warnings.warn(f"skipped {len(too_long)} of {len(examples)} examples longer than "
                      f"seq_len={config.seq_len} (first: example {too_long[0]})", stacklevel=2)
    return out


def _empty_rows(rows: int, seq_len: int, pad: int) -> dict[str, np.ndarray]:
    return {"tokens": np.full((rows, seq_len), pad, np.int32),
            "prompt_mask": np.zeros((rows, seq_len), bool),
            "target_mask": np.zeros((rows, seq_len), bool),
            "segment_ids": np.zeros((rows, seq_len), np.int32),
            "positions": np.zeros((rows, seq_len), np.int32)}


class BatchIterator:
    """An endless (or `num_epochs`-long) iterator of batches; see the module docstring.

    Args:
      examples: tokenised examples (`tokenize_examples`), each at most `seq_len` long.
      config: the `BatchConfig` they were tokenised with.
      special: the PAD/EOS ids to fill with (`SpecialIds.from_tokenizer`).
      state: a `get_state()` dict to resume from.
    """

    def __init__(self, examples: Sequence[TokenizedExample], config: BatchConfig, special: SpecialIds,
                 state: dict | None = None):
        if not examples:
            raise DataError("BatchIterator needs at least one example")
        longest = max(len(e) for e in examples)
        if longest > config.seq_len:
            raise DataError(f"an example is {longest} tokens, more than seq_len={config.seq_len}; "
                            "tokenise with the same BatchConfig")
        if config.fill_with_eos and special.eos is None:
            raise DataError("fill_with_eos=True needs an EOS id")
        self.examples = list(examples)
        self.config = config
        self.special = special
        self._epoch, self._position = 0, 0
        self._order_epoch, self._order = -1, None
        if state is not None:
            self.set_state(state)

    # -- state -----------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """A JSON-able dict; `set_state` of it on a fresh iterator continues this one exactly."""
        return {"epoch": self._epoch, "position": self._position, "seed": self.config.seed,
                "num_examples": len(self.examples)}

    def set_state(self, state: dict) -> None:
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise DataError(f"iterator state lacks {sorted(missing)}: {state!r}")
        for key, mine in (("seed", self.config.seed), ("num_examples", len(self.examples))):
            if key in state and state[key] != mine:
                raise DataError(f"iterator state was saved with {key}={state[key]}, but this iterator has "
                                f"{key}={mine}: resume with the same data and BatchConfig.seed")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self.examples):
            raise DataError(f"iterator state out of range: epoch={epoch}, position={position} "
                            f"({len(self.examples)} examples)")
        self._epoch, self._position = epoch, position

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- rows ------------------------------------------------------------------------------------
    def _order_for(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.examples)
            self._order = (np.random.default_rng([self.config.seed, epoch]).permutation(n)
                           if self.config.shuffle else np.arange(n))
            self._order_epoch = epoch
        return self._order

    def _exhausted(self) -> bool:
        """Move to the next epoch at the end of one; True when `num_epochs` are done."""
        if self._position >= len(self.examples):
            self._epoch, self._position = self._epoch + 1, 0
        return self.config.num_epochs is not None and self._epoch >= self.config.num_epochs

    def _write_row(self, batch: dict, row: int) -> None:
        """Fill batch row `row` from the stream (advances the state)."""
        config, order = self.config, self._order_for(self._epoch)
        start, segment = 0, 0
        while self._position < len(self.examples):
            example = self.examples[int(order[self._position])]
            n = len(example)
            if start + n > config.seq_len:
                break
            segment += 1
            span = slice(start, start + n)
            batch["tokens"][row, span] = example.ids
            batch["prompt_mask"][row, start:start + example.prompt_len] = True
            batch["target_mask"][row, start + example.prompt_len:start + n] = True
            batch["segment_ids"][row, span] = segment
            batch["positions"][row, span] = np.arange(n) if example.positions is None else example.positions
            start += -n % config.align + n  # the next example starts on a block boundary (PAD between)
            self._position += 1
            if not config.pack:
                break
        if config.fill_with_eos and start < config.seq_len:
            rest = slice(start, config.seq_len)
            batch["tokens"][row, rest] = self.special.eos
            batch["target_mask"][row, rest] = True
            batch["segment_ids"][row, rest] = segment
            batch["positions"][row, rest] = np.arange(start, config.seq_len)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        config = self.config
        batch = _empty_rows(config.batch_size, config.seq_len, self.special.pad)
        rows = 0
        while rows < config.batch_size and not self._exhausted():
            self._write_row(batch, rows)
            rows += 1
        if rows == 0:
            raise StopIteration
        lo = config.shard_index * config.rows_per_shard
        return {k: v[lo:lo + config.rows_per_shard] for k, v in batch.items()}


def make_batch_iterator(examples: Sequence[Example], tokenizer: Tokenizer, config: BatchConfig,
                        state: dict | None = None) -> BatchIterator:
    """`tokenize_examples` + `BatchIterator` in one call."""
    tokenized = tokenize_examples(examples, tokenizer, config)
    return BatchIterator(tokenized, config, SpecialIds.from_tokenizer(tokenizer, config), state)
