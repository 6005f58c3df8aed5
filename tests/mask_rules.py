"""Per-element attention rules written out from algorithms.md §5 and §7, independent of
jaxdllm's vectorised `MaskSpec`."""

import itertools

import numpy as np


def brute_force(kind, q_len, kv_len, *, q_offset=0, block=None, prefix=0):
    out = np.zeros((q_len, kv_len), bool)
    n = kv_len // 2
    for i, j in itertools.product(range(q_len), range(kv_len)):
        q = q_offset + i
        if kind == "bidirectional":
            ok = True
        elif kind == "causal":
            ok = j <= q
        elif kind == "block_causal":
            ok = j // block <= q // block
        elif kind == "block_diffusion":
            q_clean, k_clean = q >= n, j >= n
            bq, bk = (q % n) // block, (j % n) // block
            ok = ((q_clean == k_clean and bq == bk)            # 1. same half, same block
                  or (not q_clean and k_clean and bq > bk)     # 2. x_t sees earlier clean blocks
                  or (q_clean and k_clean and bq >= bk))       # 3. x_0 is block-causal
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
        out[i, j] = ok
    return out
