"""The schedulers the engine is measured against, behind the engine's own surface (`submit`,
`cancel`, `start`, `shutdown`, `stats`), so the same server runs either:

* `StaticBatchEngine(slots=N)`: a batch formed once, as a serving framework's request batching does
  (Ray Serve's `@serve.batch`): up to N waiting requests with the same settings, gathered for at
  most `batch_wait_s`, decode in one `Sampler` call; none joins or leaves until the whole batch is
  done, and each answer is sent whole at the end.
* `StaticBatchEngine(slots=1)`: requests one at a time, each a plain `generate` call.

A batch is padded to N rows (copies of its first prompt, dropped), so one program per config and
prompt bucket serves every batch. Greedy answers equal the continuous engine's; with sampling, a
batch shares one key (the first request's seed).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxdllm import sharding as shd
from jaxdllm.decoding.sampler import Sampler
from jaxdllm.serving.engine import Engine
from jaxdllm.serving.requests import Request


class StaticBatchEngine(Engine):
    """Batches formed once (see the module docstring). Args as `Engine`, plus `batch_wait_s`: how
    long the oldest waiting request waits for others to fill its batch."""

    def __init__(self, model, tokenizer, *, slots: int = 8, max_queue: int = 64, batch_wait_s: float = 0.01,
                 policy_params=None, companions: dict | None = None, rules=shd.DEFAULT_RULES):
        super().__init__(model, tokenizer, slots=slots, max_queue=max_queue, policy_params=policy_params,
                         companions=companions, rules=rules)
        self._sampler = Sampler(model, rules)
        self.batch_wait_s = batch_wait_s
        self._running = 0

    def warm_up(self, prompt_ids, config) -> None:
        """Compile the batch program for prompts like `prompt_ids` with `config`."""
        live = self._prepare(Request("warm-up", tuple(prompt_ids), config))
        self._decode([live, live])

    def _decode(self, batch: list) -> np.ndarray:
        """`[len(batch), G]` generated tokens of one padded batch."""
        config = batch[0].request.config
        rows = [list(x.request.prompt_ids) for x in batch]
        rows += [rows[0]] * (self.slots - len(rows))
        width = max(map(len, rows))
        pad = self.model_config.pad_token_id or 0
        ids = np.array([[pad] * (width - len(r)) + r for r in rows], np.int32)
        mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int32)
        out = self._sampler(ids, config, mask, key=jax.random.PRNGKey(batch[0].request.seed),
                            policy_params=self._second(config))
        self.dispatches += 1
        for live, nfe in zip(batch, out.nfe):
            live.forwards = int(nfe)
        return np.asarray(out.generated)[:len(batch)]

    def _tick(self) -> bool:
        self._take_cancellations()
        with self._lock:
            if not self._waiting:
                return False
            first = self._waiting[0]
            batch = [x for x in self._waiting if x.request.config == first.request.config][:self.slots]
            if len(batch) < self.slots and time.monotonic() - first.queued_at < self.batch_wait_s:
                wait = True
            else:
                wait = False
                for live in batch:
                    self._waiting.remove(live)
                self._running = len(batch)
        if wait:
            time.sleep(self.batch_wait_s / 4)
            return True
        try:
            generated = self._decode(batch)
        except Exception as e:
            for live in batch:
                self._finish(live, "error", f"{type(e).__name__}: {e}")
        else:
            for live, row in zip(batch, generated):
                piece = live.stream.extend(row.tolist(), final=True)
                self._finish(live, piece.finish_reason or "length", text=piece.text, tokens=piece.token_ids)
        finally:
            self._running = 0
        return self._busy()

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._waiting) or self._running > 0

    def stats(self) -> dict:
        with self._lock:
            waiting = len(self._waiting)
        return {"running": self._running, "waiting": waiting, "dispatches": self.dispatches, "slots": self.slots,
                "programs": len(self._programs), "groups": 0, "compiles": 0}
