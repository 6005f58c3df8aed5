"""Multiverse Attention's structure from token ids: position ids and the `multiverse` mask's per-token arrays.

Multiverse (Yang et al. 2025, arXiv 2506.09991) writes a parallel block as

    <Parallel><Goal><Outline>1</Outline>...</Goal><Path>1:...</Path><Path>2:...</Path>
    <Conclusion>...</Conclusion></Parallel>

and trains with (the published rules, `train/utils.py` of Infini-AI-Lab/Multiverse):

* **mask**: causal, except that tokens of two different `<Path>...</Path>` spans (markers included) of
  the same `<Parallel>` never see each other, at any nesting depth. Goal, Outline and Conclusion stay
  causal (every path sees the Goal, the Conclusion sees every path); tokens between spans belong to no
  span and stay visible.
* **positions**: `goal_end` = the position of the block's `</Goal>`. Each `<Path>` is placed at
  `goal_end + 1` (the tokens after it follow on), so every path of a block starts at the same position;
  at `</Path>`, `max_path_len = max(max_path_len, pos(</Path>) - goal_end)`; `<Conclusion>` is placed at
  `goal_end + max_path_len + 1`, right after the longest path. A stack handles nested blocks. Every other
  token (text, Outline, padding) is one position after the token before it.

`multiverse_layout` computes both with one `lax.scan` over the ids (a stack of static depth
`max_depth`), so it runs inside a jitted training step. A block without `</Goal>` takes its `<Parallel>`'s
position as `goal_end`. Tags in a malformed place (a `<Path>` outside every block, a `</Path>` outside a
path, a block nested deeper than `max_depth`) are ordinary tokens. `multiverse_attention` wraps the
result into a `MaskSpec(kind="multiverse")` (`jaxdllm/attention/mask.py`) with optional segment ids.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from jaxdllm.attention.mask import MaskSpec
from jaxdllm.errors import ConfigError

# indices into the 12 tags in the published order (`jaxdllm.data.multiverse_tags.TAGS`)
_PAR, _END_PAR, _END_GOAL, _PATH, _END_PATH, _CONCL = 2, 3, 5, 8, 9, 10
DEFAULT_MAX_DEPTH = 4


class MultiverseLayout(NamedTuple):
    """`multiverse_layout`'s result.

    Attributes:
      positions: `[B, L]` int32 RoPE position ids (the published shift rules).
      parallel_ids: `[B, L, D]` int32, at depth d the id (>= 1, unique in the row) of the enclosing
        `<Parallel>` block of depth d, 0 outside one.
      path_ids: `[B, L, D]` int32, at depth d the number (1, 2, ...) of that block's path the token
        lies in (markers included), 0 outside every path of it.
    """

    positions: jax.Array
    parallel_ids: jax.Array
    path_ids: jax.Array


def _check_tags(tag_ids: Sequence[int], max_depth: int) -> tuple[int, ...]:
    tags = tuple(int(t) for t in tag_ids)
    if len(tags) != 12 or len(set(tags)) != 12:
        raise ConfigError("tag_ids must be the 12 distinct Multiverse tag ids in the published order (<Think> "
                          "</Think> <Parallel> </Parallel> <Goal> </Goal> <Outline> </Outline> <Path> </Path> "
                          f"<Conclusion> </Conclusion>; jaxdllm.data.multiverse_tags.TAG_IDS), got {tag_ids!r}")
    if not isinstance(max_depth, int) or max_depth < 1:
        raise ConfigError(f"max_depth must be a positive int (the deepest nesting of <Parallel>), got {max_depth!r}")
    return tags


def _row_layout(ids: jax.Array, tags: tuple[int, ...], max_depth: int):
    """One row: `[L]` ids -> positions `[L]`, parallel ids `[L, D]`, path ids `[L, D]`."""
    D = max_depth
    levels = jnp.arange(D)
    zeros = jnp.zeros((D,), jnp.int32)
    # carry: next ordinary position, open depth, ignored (too deep) depth, block counter, per-level stacks
    init = (jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.int32(0), zeros, zeros, zeros, zeros, zeros)

    def step(carry, t):
        pos, depth, over, counter, block, goal_end, max_len, n_paths, cur = carry
        d = jnp.maximum(depth - 1, 0)
        inside = (depth > 0) & (over == 0)
        at_d = levels == d
        is_ = lambda k: t == tags[k]
        open_par = is_(_PAR) & (over == 0) & (depth < D)
        too_deep = is_(_PAR) & ~open_par
        close_par = is_(_END_PAR) & (over == 0) & (depth > 0)
        close_deep = is_(_END_PAR) & (over > 0)
        open_path = is_(_PATH) & inside
        close_path = is_(_END_PATH) & inside & (cur[d] > 0)
        end_goal = is_(_END_GOAL) & inside
        conclusion = is_(_CONCL) & inside

        here = jnp.where(open_path, goal_end[d] + 1, jnp.where(conclusion, goal_end[d] + max_len[d] + 1, pos))
        # openers change the stack before the token is recorded
        new_level = open_par & (levels == depth)
        block = jnp.where(new_level, counter + 1, block)
        goal_end = jnp.where(new_level, here, goal_end)
        max_len = jnp.where(new_level, 0, max_len)
        n_paths = jnp.where(new_level, 0, n_paths)
        cur = jnp.where(new_level, 0, cur)
        counter = counter + open_par.astype(jnp.int32)
        depth = depth + open_par.astype(jnp.int32)
        n_paths = n_paths + (open_path & at_d).astype(jnp.int32)
        cur = jnp.where(open_path & at_d, n_paths, cur)

        live = levels < depth
        out = (here, jnp.where(live, block, 0), jnp.where(live, cur, 0))

        # closers change it after
        max_len = jnp.where(close_path & at_d, jnp.maximum(max_len, here - goal_end), max_len)
        cur = jnp.where(close_path & at_d, 0, cur)
        goal_end = jnp.where(end_goal & at_d, here, goal_end)
        depth = depth - close_par.astype(jnp.int32)
        over = over + too_deep.astype(jnp.int32) - close_deep.astype(jnp.int32)
        return (here + 1, depth, over, counter, block, goal_end, max_len, n_paths, cur), out

    _, (positions, parallel_ids, path_ids) = jax.lax.scan(step, init, ids.astype(jnp.int32))
    return positions, parallel_ids, path_ids


def multiverse_layout(ids: jax.Array, tag_ids: Sequence[int], *, max_depth: int = DEFAULT_MAX_DEPTH
                      ) -> MultiverseLayout:
    """The published Multiverse position ids and the mask's per-token structure, from token ids.

    Args:
      ids: `[B, L]` int token ids (a row is one sequence from its first token; padding anywhere is
        an ordinary token here: mask it with segment ids).
      tag_ids: the 12 tag ids in the published order (`jaxdllm.data.multiverse_tags.TAG_IDS.values()`);
        static.
      max_depth: deepest `<Parallel>` nesting tracked (static); deeper blocks are ordinary text.

    Returns:
      `MultiverseLayout(positions [B, L], parallel_ids [B, L, D], path_ids [B, L, D])`, int32, D =
      `max_depth`. Rows without tags get `positions = arange(L)` and all-zero structure (plain causal).
    """
    tags = _check_tags(tag_ids, max_depth)
    ids = jnp.asarray(ids)
    if ids.ndim != 2:
        raise ConfigError(f"multiverse_layout takes [B, L] ids, got shape {ids.shape}")
    positions, parallel_ids, path_ids = jax.vmap(lambda row: _row_layout(row, tags, max_depth))(ids)
    return MultiverseLayout(positions, parallel_ids, path_ids)


def multiverse_attention(ids: jax.Array, tag_ids: Sequence[int], *, segment_ids: jax.Array | None = None,
                         max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[MaskSpec, jax.Array]:
    """`(MaskSpec(kind="multiverse", ...), positions [B, L])` for a forward over `ids [B, L]`.

    `segment_ids` (`[B, L]` int, 0 = padding) restricts visibility further, as for every kind.
    """
    layout = multiverse_layout(ids, tag_ids, max_depth=max_depth)
    seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    mask = MaskSpec(kind="multiverse", parallel_ids=layout.parallel_ids, path_ids=layout.path_ids,
                    q_segment_ids=seg, kv_segment_ids=seg)
    return mask, layout.positions
