"""Multiverse Attention's mask and position ids written out from the published description (Yang et al.
2025, `train/utils.py` of Infini-AI-Lab/Multiverse, as summarised in the project's reference notes):
a per-sequence stack walk over a Python list, independent of `jaxdllm.attention.multiverse`.

Mask: start from causal; each `<Path>...</Path>` span (markers included) is recorded under the nearest
enclosing `<Parallel>`; at `</Parallel>` every pair of different spans is masked both ways.
Positions: start at 0, 1, ...; at each `<Path>` every later position is shifted so that `<Path>` sits at
goal_end + 1 (goal_end = the position of `</Goal>`, or of `<Parallel>` when there is none); at `</Path>`
max_path_len = max(max_path_len, pos(</Path>) - goal_end); at `<Conclusion>` every later position is
shifted so that it sits at goal_end + max_path_len + 1.
"""

from __future__ import annotations

import numpy as np


def reference_layout(tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`tokens`: one sequence as token texts (a tag is one item). Returns (positions [L], mask [L, L] bool)."""
    n = len(tokens)
    mask = np.tril(np.ones((n, n), bool))
    pos = list(range(n))
    stack = []
    for i, tok in enumerate(tokens):
        for block in stack:  # this token lies in every open span
            if block["open"] is not None:
                block["open"].append(i)
        top = stack[-1] if stack else None

        def shift_to(target):
            delta = target - pos[i]
            for j in range(i, n):
                pos[j] += delta

        if tok == "<Parallel>":
            stack.append({"goal_end": pos[i], "max_len": 0, "spans": [], "open": None})
        elif tok == "</Goal>" and top:
            top["goal_end"] = pos[i]
        elif tok == "<Path>" and top:
            shift_to(top["goal_end"] + 1)
            top["open"] = [i]
        elif tok == "</Path>" and top and top["open"] is not None:
            top["max_len"] = max(top["max_len"], pos[i] - top["goal_end"])
            top["spans"].append(top["open"])
            top["open"] = None
        elif tok == "<Conclusion>" and top:
            shift_to(top["goal_end"] + top["max_len"] + 1)
        elif tok == "</Parallel>" and top:
            stack.pop()
            for a, span_a in enumerate(top["spans"]):
                for b, span_b in enumerate(top["spans"]):
                    if a != b:
                        mask[np.ix_(span_a, span_b)] = False
    return np.array(pos), mask


def split_tokens(text: str, tags) -> list[str]:
    """`text` as token texts: each tag one item, every other character one item."""
    out, i = [], 0
    while i < len(text):
        tag = next((t for t in tags if text.startswith(t, i)), None)
        out.append(tag or text[i])
        i += len(tag) if tag else 1
    return out
