"""The serving engine: keeps the compiled decoding loop's rows full while requests come and go.

    engine = Engine(model, tokenizer, slots=8)
    engine.start()                                       # the scheduling loop, in a thread
    engine.submit(Request("r1", ids, config), on_event)  # events as the answer is decided
    engine.shutdown()                                    # drain, then stop

Requests that decode with the same `SamplerConfig` and prompt layout (prompts in one
`prompt_bucket`) share the slots of one compiled program (`jaxdllm.decoding.slots`): one compiled
step per config and shape bucket, one prefill per bucket, nothing recompiled in steady state
(`stats()["compiles"]`). Each dispatch runs up to `steps_per_dispatch` steps of every running
slot and returns as soon as one finishes; then finished rows are released, waiting requests are
prefilled into free slots (each its own prompt, while the other slots keep their state), and each
running request's newly decided text is sent.

A slot's tokens are those of `generate(model, [prompt], config, key=PRNGKey(seed))` for its
request alone, whatever shares the slots (`tests/serving/test_engine.py` checks every canvas).

What is streamed, per canvas (the answer's tokens that are decided, final and left-contiguous):
  * masked (LLaDA, Dream, block diffusion): as positions are committed, left to right, so at the
    latest when a block is full; with a policy that re-decides a block's tokens until the block
    closes (LLaDA2.1's token editing), per closed block;
  * draft (Jacobi, Lookahead, Medusa, ...): per accepted draft;
  * uniform (DiffusionGemma): per committed canvas;
  * FreeDave, APD: per verified or accepted span;
  * Multiverse, Hogwild!: the whole answer when the request ends (its text is assembled from shared pages
    then: a path, or a worker's step, is not final text until the merge or the end).
An answer ends at its first stop token (EOS, end of turn), a stop string or `max_tokens`; its row is
released at once, even where the canvas has undecided positions after it.

Memory is bounded: at most `max_groups` programs hold slots (an idle one is dropped for a new
one), `slots` rows each, and at most `max_queue` requests wait (`QueueFull` beyond).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.decoding import slots as slot_programs
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.decoding.layout import Layout
from jaxdllm.decoding.policies.base import Policy
from jaxdllm.decoding.sampler import Prepared, _decoding_mesh, _mesh_of, prepare, second_model
from jaxdllm.errors import ConfigError, ConfigTypeError, InputError
from jaxdllm.serving.requests import EngineStopped, Event, QueueFull, Request
from jaxdllm.serving.text_stream import AnswerStream

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Live:
    """A request inside the engine."""

    request: Request
    on_event: Callable[[Event], None]
    prepared: Prepared
    stream: AnswerStream
    answer_col: int
    slot: int | None = None
    forwards: int = 0
    queued_at: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass(eq=False)
class _Group:
    """The slots of one compiled program: one config and one prompt layout.

    The stack holds as many slots as the running requests need, in sizes 1, 2, 4, ... up to
    `slots` (one compiled step per size): a lone request steps one row, not `slots`."""

    config: SamplerConfig
    lay: Layout
    slots: int
    states: object = None          # stacked DecodeState (leaves [S, ...]) once a request was admitted
    segs: np.ndarray = None        # [S, 1, Lp]
    answer_starts: np.ndarray | None = None  # [S, 1] (block-causal layout) or None
    live: list = dataclasses.field(default_factory=list)  # [S] _Live or None

    @property
    def active(self) -> np.ndarray:
        return np.array([x is not None for x in self.live], bool)

    def reserve(self, n: int) -> list[int]:
        """Up to `n` free slots, doubling the stack while it has fewer (at most `slots`)."""
        while True:
            free = [i for i, x in enumerate(self.live) if x is None]
            size = len(self.live)
            if len(free) >= n or size >= self.slots:
                return free[:n]
            self._reorder(list(range(size)) + [0] * (min(2 * size, self.slots) - size))

    def size_for(self, n: int) -> int:
        """The stack size (1, 2, 4, ... or `slots`) that holds `n` slots."""
        return min(1 << max(n - 1, 0).bit_length(), self.slots)

    def shrink(self) -> None:
        """Halve the stack while its running slots fit in half (so the stack sizes, and the programs
        that move slots between them, are the same few in every run)."""
        while self.states is not None and len(self.live) > 1:
            used = [i for i, x in enumerate(self.live) if x is not None]
            half = (len(self.live) + 1) // 2
            if len(used) > half:
                return
            self._reorder(used + [used[0] if used else 0] * (half - len(used)), keep=len(used))

    def _reorder(self, order: list[int], keep: int | None = None) -> None:
        """The stack's slots `order` (the first `keep` keep their requests; default: the old size)."""
        keep = len(self.live) if keep is None else keep
        idx = np.asarray(order, np.int32)
        self.states = slot_programs.gather(self.states, idx)
        self.segs = self.segs[idx]
        if self.answer_starts is not None:
            self.answer_starts = self.answer_starts[idx]
        self.live = [self.live[i] if k < keep else None for k, i in enumerate(order)]
        for k, live in enumerate(self.live):
            if live is not None:
                live.slot = k


def _holds_blocks(config: SamplerConfig) -> bool:
    """The policy may re-decide a block's decided tokens until the block closes (`Policy.holding`)."""
    policy = config.policy
    return isinstance(policy, Policy) and type(policy).holding is not Policy.holding


class Engine:
    """A fixed set of row slots over the stepwise driver, fed from a bounded queue.

    Args:
      model: a `Transformer` (on one device, or sharded over a mesh: rows are then replicated
        and the weights stay sharded).
      tokenizer: its `Tokenizer` (`jaxdllm.load` gives one whose `stop_ids` hold the model's EOS
        and end of turn): incremental text and stop tokens.
      slots: rows of each compiled program.
      max_queue: requests waiting for a slot, at most.
      steps_per_dispatch: steps of the compiled loop per call (more: fewer host round trips;
        fewer: sooner admission and streaming).
      max_groups: programs (config x prompt bucket) holding slots at once.
      policy_params, companions: a policy's own parameters or its second model by role, as for
        `generate`; given to the requests whose policy reads them.
      rules: the logical-axis rules the model was placed with.
    """

    def __init__(self, model, tokenizer, *, slots: int = 8, max_queue: int = 64, steps_per_dispatch: int = 4,
                 max_groups: int = 4, policy_params=None, companions: dict | None = None,
                 rules=shd.DEFAULT_RULES):
        for name, value in (("slots", slots), ("steps_per_dispatch", steps_per_dispatch), ("max_groups", max_groups)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ConfigError(f"max_queue must be a non-negative integer, got {max_queue!r}")
        self.model_config = model.config
        self.tokenizer = tokenizer
        if model.options.remat != "none":
            model = model.with_options(remat="none")
        self._graphdef, self._params = nnx.split(model)
        self._mesh = _mesh_of(self._params)
        if self._mesh is not None:  # one request per row: rows replicated, weights as placed
            rules = {**dict(rules), "batch": None}
        self._rules = shd.frozen_rules(rules)
        self._state_sharding = (jax.sharding.NamedSharding(self._mesh, jax.sharding.PartitionSpec())
                                if self._mesh is not None else
                                jax.sharding.SingleDeviceSharding(jax.tree.leaves(self._params)[0].devices().pop()))
        self.slots, self.max_queue, self.steps_per_dispatch, self.max_groups = slots, max_queue, steps_per_dispatch, max_groups
        self._policy_params, self._companions = policy_params, companions
        self._groups: dict[tuple, _Group] = {}
        self._splits: dict[SamplerConfig, tuple] = {}
        self._programs: set[tuple] = set()
        self._waiting: collections.deque[_Live] = collections.deque()
        self._by_id: dict[str, _Live] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Condition()
        self._accepting = True
        self._stop = False
        self._thread: threading.Thread | None = None
        self.dispatches = 0

    # -- requests ---------------------------------------------------------------------------------
    def _second(self, config: SamplerConfig):
        policy, role = config.policy, config.policy.companion
        if role and self._companions and role in self._companions:  # a second model given by its role
            return second_model(config, None, {role: self._companions[role]})
        return second_model(config, self._policy_params if policy.needs_params else None, None)

    def _placed(self, tree):
        """`tree` committed to the engine's device (or replicated over the model's mesh): every program
        then sees its arguments placed the same way, so none compiles twice."""
        return jax.device_put(tree, self._state_sharding)

    def _split_second(self, config: SamplerConfig):
        """`(graphdef, state)` of the second model or parameters `config`'s policy reads (split once)."""
        if config not in self._splits:
            second = self._second(config)
            self._splits[config] = (None, None) if second is None else nnx.split(second)
        return self._splits[config]

    def _prepare(self, request: Request) -> _Live:
        if not isinstance(request, Request):
            raise ConfigTypeError(f"submit takes a jaxdllm.serving.requests.Request, got {type(request).__name__}")
        config = request.config
        if not isinstance(config, SamplerConfig):
            raise ConfigTypeError(f"Request.config must be a SamplerConfig, got {type(config).__name__}")
        if config.max_trajectory:
            raise ConfigError("the engine records no trajectory: use max_trajectory=0 (generate records one)")
        if request.max_tokens is not None and (not isinstance(request.max_tokens, int) or request.max_tokens < 1):
            raise InputError(f"max_tokens must be a positive integer, got {request.max_tokens!r}")
        if not request.prompt_ids:
            raise InputError("the prompt has no tokens")
        second = self._second(config)
        p = prepare(self.model_config, np.asarray([request.prompt_ids], np.int32), None, config, 1, second)
        answer_col = p.lay.prompt_len if p.answer_start is None else int(p.answer_start[0])
        return _Live(request, None, p, AnswerStream(self.tokenizer, request.max_tokens, request.stop), answer_col)

    def check(self, request: Request) -> None:
        """Raise `InputError` / `ConfigError` (naming the limit or setting) if `request` cannot decode:
        a prompt past the model's `max_position`, ids outside the vocabulary, a config this model
        cannot decode with."""
        self._prepare(request)

    def submit(self, request: Request, on_event: Callable[[Event], None]) -> None:
        """Queue `request`. `on_event(event)` is called from the engine's thread with each `Event`
        (the last has `finished=True`); it must not block.

        Raises:
          InputError / ConfigError: the request cannot decode (see `check`).
          QueueFull: `max_queue` requests already wait (retry after `retry_after_s`).
          EngineStopped: the engine is draining or stopped.
        """
        live = self._prepare(request)
        live.on_event = on_event
        with self._lock:
            if not self._accepting:
                raise EngineStopped("the engine is shutting down and takes no new request")
            if request.request_id in self._by_id:
                raise InputError(f"request id {request.request_id!r} is already in the engine")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting for a row (the bound is "
                                f"{self.max_queue}): retry shortly", retry_after_s=1.0)
            self._waiting.append(live)
            self._by_id[request.request_id] = live
            self._lock.notify_all()

    def cancel(self, request_id: str) -> None:
        """Drop a waiting request, or free a running one's row at the next dispatch; its last event
        has finish_reason "cancelled". Unknown or finished ids are ignored."""
        with self._lock:
            if request_id in self._by_id:
                self._cancelled.add(request_id)
                self._lock.notify_all()

    # -- the loop ---------------------------------------------------------------------------------
    def _emit(self, live: _Live, text: str, tokens: tuple, finish_reason: str | None, error: str | None = None):
        event = Event(text=text, token_ids=tokens, finished=finish_reason is not None, finish_reason=finish_reason,
                      prompt_tokens=len(live.request.prompt_ids), completion_tokens=live.stream.completion_tokens,
                      forwards=live.forwards, error=error)
        try:
            live.on_event(event)
        except Exception:  # a caller's callback must not stop the other requests
            log.exception("on_event of request %s raised", live.request.request_id)

    def _finish(self, live: _Live, reason: str, error: str | None = None, text: str = "", tokens: tuple = ()) -> None:
        group = self._group_of(live)
        if live.slot is not None and group is not None:
            group.live[live.slot] = None
        live.slot = None
        with self._lock:
            self._by_id.pop(live.request.request_id, None)
            self._cancelled.discard(live.request.request_id)
        self._emit(live, text, tokens, reason, error)

    def _group_of(self, live: _Live) -> _Group | None:
        return self._groups.get((live.request.config, live.prepared.lay))

    def _take_cancellations(self) -> None:
        with self._lock:
            ids, self._cancelled = self._cancelled, set()
            waiting = [x for x in self._waiting if x.request.request_id in ids]
            for live in waiting:
                self._waiting.remove(live)
        for live in waiting:
            self._finish(live, "cancelled")
        for group in self._groups.values():
            for live in group.live:
                if live is not None and live.request.request_id in ids:
                    self._finish(live, "cancelled")

    def _group_for(self, key: tuple, config: SamplerConfig, lay: Layout, keep=()) -> _Group | None:
        """The group of `key`, made if there is room (an idle group outside `keep` gives its place)."""
        group = self._groups.get(key)
        if group is not None:
            return group
        if len(self._groups) >= self.max_groups:
            idle = next((k for k, g in self._groups.items() if not g.active.any() and k not in keep), None)
            if idle is None:
                return None
            del self._groups[idle]
        group = self._groups[key] = _Group(config, lay, self.slots)
        return group

    def _admit_waiting(self) -> None:
        """Waiting requests into free slots, in arrival order; a request whose program has no free
        slot waits while later ones of other programs go ahead. The requests joining one program are
        prefilled together."""
        with self._lock:
            waiting = list(self._waiting)
        joining: dict[tuple, tuple[_Group, list]] = {}
        for live in waiting:
            config, p = live.request.config, live.prepared
            group = self._group_for((config, p.lay), config, p.lay, keep=joining)
            if group is None:
                continue
            entry = joining.setdefault((config, p.lay), (group, []))
            if group.states is None or len(entry[1]) < len(group.reserve(len(entry[1]) + 1)):
                if len(entry[1]) < self.slots:
                    entry[1].append(live)
        for group, lives in joining.values():
            if not lives:
                continue
            with self._lock:
                for live in lives:
                    self._waiting.remove(live)
            try:
                self._admit(group, lives)
            except Exception as e:
                log.exception("admitting %d requests failed", len(lives))
                for live in lives:
                    self._finish(live, "error", f"{type(e).__name__}: {e}")

    def _admit(self, group: _Group, lives: list) -> None:
        """Prefill the prompts of `lives` (padded to a stack size) and write their states into free
        slots of `group` (its first stack, if it has none)."""
        config = group.config
        n = len(lives)
        size = group.size_for(n)
        padded = lives + [lives[0]] * (size - n)  # copies of the first: prefilled, never written
        ps = [x.prepared for x in padded]
        ids = np.stack([p.ids for p in ps])
        segs = np.stack([p.seg for p in ps])
        valid = np.stack([p.valid for p in ps])
        keys = np.stack([np.asarray(jax.random.PRNGKey(x.request.seed)) for x in padded])
        answers = None if ps[0].answer_start is None else np.stack([p.answer_start for p in ps])
        params_def, params_state = self._split_second(config)
        self._programs.add((config, group.lay))
        with _decoding_mesh(self._mesh):
            new = self._placed(slot_programs.prefill(
                self._graphdef, self._params, ids, segs, valid, keys, params_state, answers, canvas=config.canvas,
                lay=group.lay, config=config, params_def=params_def, rules=self._rules))
            if group.states is None:
                group.states, group.segs = new, segs
                group.answer_starts = answers
                group.live = list(lives) + [None] * (size - n)
                slots = list(range(n))
            else:
                slots = group.reserve(n)
                assert len(slots) == n, "admission without free slots"
                index = np.asarray(slots + [len(group.live)] * (size - n), np.int32)  # past the stack: dropped
                group.states = slot_programs.admit(group.states, new, index)
                group.segs[slots] = segs[:n]
                if answers is not None:
                    group.answer_starts[slots] = answers[:n]
                for slot, live in zip(slots, lives):
                    group.live[slot] = live
        for slot, live in zip(slots, lives):
            live.slot = slot

    def _advance(self, group: _Group):
        """Steps of `group`'s running slots; returns what the host reads of their states."""
        config = group.config
        params_def, params_state = self._split_second(config)
        with _decoding_mesh(self._mesh):
            group.states = slot_programs.advance(
                self._graphdef, self._params, group.states, group.segs, group.answer_starts, group.active,
                params_state, canvas=config.canvas, lay=group.lay, config=config, params_def=params_def,
                rules=self._rules, steps=self.steps_per_dispatch)
            s = group.states
            return jax.device_get((s.canvas, s.undecided, s.done, s.nfe, s.block, s.step))

    def _dispatch(self, group: _Group) -> None:
        """Steps of `group`'s running slots, then what each request decided."""
        config, lay = group.config, group.lay
        group.shrink()
        canvas, undecided, done, nfe, block, step = self._advance(group)
        self.dispatches += 1
        limit = config.canvas.max_steps(config, lay)
        holds = _holds_blocks(config)
        G = config.gen_length
        for i, live in enumerate(group.live):
            if live is None:
                continue
            live.forwards = int(nfe[i, 0])
            cols = slice(live.answer_col, live.answer_col + G)
            final = ~undecided[i, 0, cols]
            ended = bool(done[i, 0]) or int(step[i]) >= limit
            if holds and not ended:  # tokens of the open block may still change
                open_from = lay.decode_start + int(block[i]) * config.block_length
                final &= np.arange(cols.start, cols.stop) < open_from
            n = G if final.all() else int(np.argmin(final))
            piece = live.stream.extend(canvas[i, 0, cols][:n].tolist(), final=ended)
            if piece.finish_reason:  # the last text and the end in one event
                self._finish(live, piece.finish_reason, text=piece.text, tokens=piece.token_ids)
            elif piece.text or piece.token_ids:
                self._emit(live, piece.text, piece.token_ids, None)

    def _tick(self) -> bool:
        """One round: cancellations, admissions, one dispatch per program with running slots.
        Returns whether anything runs or waits."""
        self._take_cancellations()
        self._admit_waiting()
        for group in list(self._groups.values()):
            if not group.active.any():
                continue
            try:
                self._dispatch(group)
            except Exception as e:  # e.g. out of memory: this program's requests fail, the engine goes on
                log.exception("a dispatch failed")
                for live in group.live:
                    if live is not None:
                        self._finish(live, "error", f"{type(e).__name__}: {e}")
                self._groups = {k: g for k, g in self._groups.items() if g is not group}
        return self._busy()

    def _busy(self) -> bool:
        with self._lock:
            waiting = bool(self._waiting)
        return waiting or any(g.active.any() for g in self._groups.values())

    def run_until_idle(self) -> None:
        """Drive the loop from the caller's thread until nothing waits or runs."""
        while self._tick():
            pass

    def _loop(self) -> None:
        while True:
            busy = self._tick()
            with self._lock:
                if self._stop:
                    return
                if not busy and not self._waiting and not self._cancelled:
                    self._lock.wait(timeout=0.5)

    @property
    def alive(self) -> bool:
        """The scheduling thread runs (False before `start` and after `shutdown`, or if it died)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run the scheduling loop in a background (daemon) thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="jaxdllm-engine", daemon=True)
        self._thread.start()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; with `drain`, let the running and waiting ones finish (up to
        `timeout` seconds); the rest end with finish_reason "error". Then stop the thread."""
        with self._lock:
            self._accepting = False
        deadline = None if timeout is None else time.monotonic() + timeout
        if drain:
            if self._thread is None:
                self.run_until_idle()
            while self._busy() and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.05)
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            left = list(self._waiting)
            self._waiting.clear()
        left += [x for g in self._groups.values() for x in g.live if x is not None]
        for live in left:
            self._finish(live, "error", "the server stopped before this request finished")

    def warm_up(self, prompt_ids, config: SamplerConfig) -> None:
        """Compile now what requests like this one (`prompt_ids`: a prompt of their bucket, `config`
        their settings) will run: the prefill of 1, 2, 4, ... prompts, the step of every stack size,
        the admissions into it and the moves between sizes. A server calls it before taking
        requests, so none waits for a compile. Decodes nothing."""
        live = self._prepare(Request("warm-up", tuple(prompt_ids), config))
        live.on_event = lambda e: None
        group = _Group(config, live.prepared.lay, self.slots)
        sizes = sorted({group.size_for(n) for n in range(1, self.slots + 1)})
        self._admit(group, [live])
        for size in sizes:
            group.live = [None] * len(group.live)
            group.reserve(size)  # grows the stack to `size`
            for n in (k for k in sizes if k <= size):
                group.live = [None] * size
                self._admit(group, [live] * n)
            group.live = [None] * size
            self._advance(group)  # no slot runs: this compiles the step of this stack size
        group.live[0] = live
        group.shrink()  # halves the stack back to one slot
        group.live[0] = None

    def stats(self) -> dict:
        """`running`, `waiting` requests; `programs` (config x prompt bucket pairs admitted), `groups`
        holding slots, `compiles` (traces of the slot programs: constant in steady state),
        `dispatches` and `slots`."""
        with self._lock:
            waiting = len(self._waiting)
        return {"running": sum(int(g.active.sum()) for g in self._groups.values()), "waiting": waiting,
                "programs": len(self._programs), "groups": len(self._groups),
                "compiles": sum(slot_programs.TRACES.values()), "dispatches": self.dispatches,
                "slots": self.slots}
