"""FLOPs of a forward, from the parameter counts of a config's family (`Family.param_counts`, the
model's abstract parameters from `nnx.eval_shape`; `ModelConfig.num_params` / `active_params`).

The one count the benchmarks (model FLOP utilisation, compute-bound estimates) use. Derivation,
for a batch of `B` rows, each feeding `T` tokens `[B, T]` that attend to `K` key positions
(`K = T` without a cache) and asking for logits at `P` of them:

* A linear layer with weight `[n_in, n_out]` costs `2 n_in n_out` FLOPs per token (one multiply
  and one add per weight). Summed over the q/k/v/o projections `[d, (H + 2 KV) hd]`, `[H hd, d]`,
  the MLP `3 x [d, m]` (or a token's `experts_per_token` routed and the shared experts
  `3 x [d, expert_dim]` each, and the router `[d, E]`): `2 N_body` per token, with `N_body` the
  active parameters less the embedding table `[V, d]` and the LM head `[d, V]`. The norm scales
  and biases in that count add 2 FLOPs per weight and token as well: about their real
  elementwise cost, and under 1 % of the total at any real width.
* The LM head `[d, V]` runs only where logits are asked for: `2 d V` per such position.
* The embedding lookup `[V, d]` is a gather: no FLOPs.
* Attention, per layer: scores `q k^T` (`[B, H, T, hd] x [B, H, hd, K]`) and the weighted sum of
  values (`[B, H, T, K] x [B, H, K, hd]`) are `2 T K H hd` FLOPs each: `4 T K H hd` per row and
  layer, with the layer's own head dim (`ModelConfig.kv_shape`: a family's layers may differ).
  Masked pairs count (a dense kernel computes them).
* Not counted: softmax, RoPE, activations (elementwise, `O(T K H + T d)` per layer).

    forward = B (2 N_body T + 2 d V P + 4 T K H sum_layers hd)

With `P = T` this is the usual `2 N T + attention` (`N` every active parameter but the input
embedding). A backward pass is about twice a forward.
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_of


def matmul_params(config: ModelConfig) -> int:
    """Parameters one token's forward multiplies by when its logits are computed: the active
    parameters (its family's count, `Family.param_counts`: routed experts `experts_per_token` times)
    less the input embedding table `[V, d]`, a lookup. A tied table is also the LM head, so it stays."""
    lookup = 0 if config.tie_embeddings else config.vocab_size * config.embed_dim
    return family_of(config).param_counts(config).active - lookup


def forward_flops(config: ModelConfig, tokens: int, keys: int | None = None, *, batch: int = 1,
                  logits_positions: int | None = None) -> float:
    """FLOPs of one forward (see the module docstring for the derivation).

    Args:
      config: the model's config (only its shapes and parameter counts are read).
      tokens: `T`, positions each row feeds, input ids `[batch, T]`.
      keys: `K`, key positions each query attends to (default `T`; with a K/V cache, the
        cached positions plus the fed ones).
      batch: `B`, rows.
      logits_positions: `P`, positions per row whose logits `[batch, P, V]` are computed
        (default `T`, every fed position).
    """
    c = config
    keys = tokens if keys is None else keys
    logits_positions = tokens if logits_positions is None else logits_positions
    head = c.vocab_size * c.embed_dim
    body = matmul_params(c) - head
    head_dims = sum(c.kv_shape(i)[1] for i in range(c.num_layers))
    attention = 4.0 * tokens * keys * c.num_heads * head_dims
    return batch * (2.0 * body * tokens + 2.0 * head * logits_positions + attention)
