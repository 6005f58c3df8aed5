"""Per-element attention rules written out from the published papers (BD3-LM, Jacobi Forcing, Lookahead decoding, Medusa's
tree attention, WeDLM's training mask), independent of jaxdllm's vectorised `MaskSpec`."""

import itertools

import numpy as np

# Trees of drafts (parent per node, -1: none), shared by the backend tests.
CHAIN = (-1, 0, 1, 2, 3)
# Medusa-like, numbered breadth-first (not depth-first): a root (the current token), 3 candidates for
# the next token, 3 / 2 / 1 continuations of those, then one continuation each of two of these.
MEDUSA = (-1, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 7)
# No common root (the heads' candidates for the first token are the roots), one root childless.
FOREST = (-1, -1, -1, 0, 0, 1, 3, 3, 5, 6)


def lookahead_slots(levels, width, branch_len, branches):
    """Window index -> (part, a, b): ("current",), ("look", level, column), ("branch", branch, k),
    in the order Lookahead decoding lays one forward out (Fu et al., 2024)."""
    slots = [("current", 0, 0)]
    slots += [("look", l, j) for l in range(levels) for j in range(width)]
    slots += [("branch", g, k) for g in range(branches) for k in range(branch_len)]
    return slots


def lookahead_context(slot):
    """The logical positions (1 = the first after the current token) a window token's prediction
    is conditioned on, besides the prefix and the current token: one Jacobi trajectory per column
    for lookahead tokens, the branch's own earlier tokens for branch tokens."""
    part, a, b = slot
    if part == "look":  # level a, column b sits at position 1 + a + b; it sees positions 1 .. 1 + a + b
        return {("look", 0, j) for j in range(b)} | {("look", l, b) for l in range(a + 1)}
    if part == "branch":
        return {("branch", a, k) for k in range(b + 1)}
    return set()


def tree_node(p, prefix, size, tree):
    """The tree node holding physical position p, or None (the prefix, or past the tree)."""
    r = p - prefix
    return r // size if 0 <= r < len(tree) * size else None


def brute_force(kind, q_len, kv_len, *, q_offset=0, block=None, prefix=0, window_shape=None, window=None, tree=None):
    """`[q_len, kv_len]` visibility, one pair at a time. `window` (Gemma 4 sliding layers): a causal
    query at q sees at most the W keys q-W+1..q; a bidirectional call sees its own keys and the W-1
    cached keys before its first query. `tree` (parents; `block` tokens per node, default 1): a draft
    token sees the decided text and the tokens of its node and of the nodes on its path to a root."""
    out = np.zeros((q_len, kv_len), bool)
    n = kv_len // 2
    for i, j in itertools.product(range(q_len), range(kv_len)):
        q = q_offset + i
        if kind == "bidirectional":
            ok = True if window is None else j >= q_offset - (window - 1)
        elif kind == "causal":
            ok = j <= q and (window is None or q - j < window)
        elif kind == "denoise_canvas":               # noisy queries over [noisy ; clean]
            if q < prefix:
                ok = j == q                              # a noisy prompt token: itself only
            else:
                start = prefix + (q - prefix) // block * block   # its canvas's first position
                if j >= n:                               # clean key at position j - n
                    ok = j - n < start and (window is None or j - n >= start - (window - 1))
                else:                                    # noisy key: the same canvas
                    ok = j >= prefix and (j - prefix) // block == (q - prefix) // block
        elif kind == "block_causal":
            ok = j // block <= q // block
        elif kind == "block_diffusion":
            q_clean, k_clean = q >= n, j >= n
            bq, bk = (q % n) // block, (j % n) // block
            ok = ((q_clean == k_clean and bq == bk)            # 1. same half, same block
                  or (not q_clean and k_clean and bq > bk)     # 2. x_t sees earlier clean blocks
                  or (q_clean and k_clean and bq >= bk))       # 3. x_0 is block-causal
        elif kind == "set_block":
            # Set Block Decoding's Fig. 9 is written for [clean ; masked] with h = n: top-left causal,
            # bottom-right same block, bottom-left blk(q) > blk(kv). Our layout is [masked ; clean]:
            # swap the halves back and apply the figure's three rules.
            qp, kp = (q + n) % (2 * n), (j + n) % (2 * n)   # index in the figure's layout
            h = n   # blocks start at `prefix` in each half (negative block indices before it)
            blk_q = (qp - h - prefix) // block if qp >= h else (qp - prefix) // block
            blk_k = (kp - h - prefix) // block if kp >= h else (kp - prefix) // block
            ok = ((qp < h and kp < h and kp <= qp)
                  or (qp >= h and kp >= h and blk_q == blk_k)
                  or (qp >= h and kp < h and blk_q > blk_k))
        elif kind == "wedlm":
            # WeDLM's build_2d_attention_mask (finetune/src/masking.py) on [x0 ; xt] of n tokens each, its
            # three terms: intra-block causal within a stream, xt to the x0 of earlier blocks, x0 across blocks.
            q_xt, k_xt = q >= n, j >= n
            blk_q = (q - n) // block if q_xt else q // block
            blk_k = (j - n) // block if k_xt else j // block
            ok = ((blk_q == blk_k and q_xt == k_xt and j <= q)
                  or (blk_k < blk_q and q_xt and not k_xt)
                  or (blk_k < blk_q and not q_xt and not k_xt))
        elif kind == "jacobi_forcing":
            def where(p):  # (is_prompt, block index, stream 0 noisy / 1 clean, offset in block)
                if p < prefix:
                    return True, None, None, p
                r = p - prefix
                return False, r // (2 * block), (r // block) % 2, r % block
            qp, qb, qs, qo = where(q)
            kp, kb, ks, ko = where(j)
            if qp:
                ok = kp and j <= q                       # the prompt is causal
            elif kp:
                ok = True                                # block tokens see the whole prompt
            else:                                        # same stream, earlier block or causal inside
                ok = qs == ks and (kb < qb or (kb == qb and ko <= qo))
        elif kind == "lookahead":
            levels, width, blen = window_shape
            slots = lookahead_slots(levels, width, blen, (kv_len - prefix) // max(blen, 1) + 1)
            if j < prefix:
                ok = j <= q                              # the decided text is causal
            elif q < prefix:
                ok = False
            else:
                qs, ks = slots[q - prefix], slots[j - prefix]
                ok = ks[0] == "current" or ks in lookahead_context(qs)
        elif kind == "tree":
            size = block or 1
            if j < prefix:
                ok = j <= q or q >= prefix               # the decided text: causal; all of it from the tree on
            else:
                node, key_node = tree_node(q, prefix, size, tree), tree_node(j, prefix, size, tree)
                path = []
                while node is not None and node != -1:   # walk up from the query's node
                    path.append(node)
                    node = tree[node]
                ok = key_node is not None and key_node in path
        out[i, j] = ok
    return out
