"""Data for training and evaluation: the synthetic task suite, JSONL datasets, GSM8K, the
character tokenizer of the tiny models, and deterministic, resumable batching.

Modules (one job each):
- `records`: `Example` (prompt, response, task, answer) and `DataError`.
- `multiverse_tags`: Multiverse's 12 tags and the character tokenizer with them (ids 101..112).
- `parts_task`: `parts` / `parts_mv`, independent sub-computations in a sequential and a Multiverse
  format, and the AR-to-Multiverse curriculum.
- `tasks`, `word_problems`, `list_chains`: the task suite (`Task`, registry) with a checker per task.
- `splits`: `make_split` / `make_mixture`, train and test disjoint by instance hash.
- `jsonl`: `read_jsonl` / `write_jsonl` with line-numbered errors and a skip mode.
- `gsm8k`: `load_gsm8k` from a local directory (`path`, or `$JAXDLLM_GSM8K_DIR`).
- `char_tokenizer`: the fixed character vocabulary as a Hugging Face `tokenizer.json`.
- `batching`: `BatchConfig`, `tokenize_examples`, `BatchIterator` (resumable state).
"""

from jaxdllm.data.answers import extract_final_answer, same_number
from jaxdllm.data.batching import (BATCH_KEYS, BatchConfig, BatchIterator, SpecialIds, TokenizedExample,
                                   make_batch_iterator, tokenize_examples)
from jaxdllm.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
from jaxdllm.data.gsm8k import default_gsm8k_dir, load_gsm8k
from jaxdllm.data.jsonl import JsonlConfig, JsonlDataset, read_jsonl, write_jsonl
from jaxdllm.data.records import Example
from jaxdllm.errors import DataError, DatasetNotFoundError
from jaxdllm.tokenizer import decode_response, special_token_ids  # re-exported: used with every dataset
from jaxdllm.data.splits import instance_split, make_mixture, make_split
from jaxdllm.data.tasks import (AdditionTask, CopyTask, PermutationTask, PickTask, ReverseTask, SortTask, Task,
                                TwinTask, get_task, register_task, task_names)
from jaxdllm.data.word_problems import WordProblemTask
from jaxdllm.data.list_chains import ListChainTask
from jaxdllm.data.parts_task import PartsMultiverseTask, PartsTask

__all__ = ["AdditionTask", "BATCH_KEYS", "BatchConfig", "BatchIterator", "CopyTask", "DataError",
           "DatasetNotFoundError", "Example", "JsonlConfig", "JsonlDataset", "ListChainTask", "PartsMultiverseTask", "PartsTask", "PermutationTask", "PickTask",
           "ReverseTask", "SortTask", "SpecialIds", "Task", "TwinTask", "TokenizedExample", "WordProblemTask",
           "build_char_tokenizer", "decode_response", "default_gsm8k_dir", "extract_final_answer",
           "get_task", "instance_split", "load_gsm8k", "make_batch_iterator", "make_mixture", "make_split",
           "read_jsonl", "register_task", "same_number", "save_char_tokenizer", "special_token_ids",
           "task_names", "tokenize_examples", "write_jsonl"]
