"""GenMol V2's "bracket SAFE": the SAFE strings GenMol's second release trains and samples on.

In plain SAFE a bond cut between two fragments is a ring-closure label (`2`, `%12`) that appears once in
each fragment, numbered after the labels of the real rings, so nothing in the text tells an attachment
from a ring bond. Bracket SAFE writes each attachment as `<k>` (k from 1, `<%10>` from 10 on, as GenMol's
`BracketSAFEConverter` writes it) and leaves ring closures as they are:

    SAFE           c12ccc3cc1.C3(C)C(=O)O.CC(C)C2      (ibuprofen: 1 a ring, 2 and 3 attachments)
    bracket SAFE   c1<1>ccc<2>cc1.C<2>(C)C(=O)O.CC(C)C<1>

Inside one fragment a ring label is written an even number of times (its bond opens and closes there);
an attachment label once (its other end is in another fragment, or nowhere for a prompt's open point).
That is the rule `safe_to_bracket` applies, so it converts any SAFE string, including prompts with open
attachment points. `bracket_to_safe` is GenMol's `bracketsafe2safe`: each `<k>` becomes the label
max(ring labels in the string) + k, after which the string is plain SAFE and decodes as one.

GenMol V2 trains on a fresh random view of each molecule per epoch (atoms and fragment order shuffled,
`safe2bracketsafe`); `smiles_to_bracket_safe(randomize=True, seed=...)` writes one such view.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

from jaxdllm.errors import InputError
from jaxdllm.molecules.safe_tokenizer import is_label, split_safe

SAFE_FORMATS = ("safe", "bracket")  # how a model's training strings write attachments
FORMAT_FILE = "safe_format.json"  # beside a model (and in a data folder): {"safe_format": "bracket"}

_ATTACHMENT = re.compile(r"<(%?[0-9]+)>")


def check_format(safe_format: str) -> str:
    """`safe_format` if it is one of `SAFE_FORMATS`, else an `InputError` naming them."""
    if safe_format not in SAFE_FORMATS:
        raise InputError(f"safe_format must be one of {SAFE_FORMATS}, got {safe_format!r}")
    return safe_format


def _label_value(label: str) -> int:
    return int(label.strip("%()"))


def _attachment_text(k: int) -> str:
    return f"<{k}>" if k < 10 else f"<%{k}>"


def _ring_label_text(value: int) -> str:
    return str(value) if value < 10 else f"%{value}" if value < 100 else f"%({value})"


def safe_to_bracket(safe_string: str) -> str:
    """A SAFE string (or a SAFE prompt with open attachment points) in bracket SAFE: the labels written an
    odd number of times inside a fragment become `<k>`, numbered from 1 in order of first appearance."""
    if "".join(split_safe(safe_string)) != safe_string:
        raise InputError(f"not a SAFE string (SAFE's splitter does not read all of it): {safe_string!r}")
    numbers: dict[str, int] = {}
    out = []
    for fragment in safe_string.split("."):
        pieces = split_safe(fragment)
        counts = collections.Counter(p for p in pieces if is_label(p))
        odd = [is_label(p) and counts[p] % 2 for p in pieces]
        out.append("".join(_attachment_text(numbers.setdefault(p, len(numbers) + 1)) if attach else p
                           for p, attach in zip(pieces, odd)))
    return ".".join(out)


def bracket_to_safe(text: str) -> str:
    """A bracket SAFE string (a model's sample) as plain SAFE (GenMol's `bracketsafe2safe`): `<k>` becomes the
    label max(ring labels) + k. Malformed brackets are left as they are (that fragment then fails to decode
    and GenMol's decoding drops it)."""
    start = max((_label_value(p) for p in split_safe(text) if is_label(p)), default=0)  # `<k>` is one piece
    return _ATTACHMENT.sub(lambda m: _ring_label_text(start + _label_value(m.group(1))), text)


def smiles_to_bracket_safe(smiles: str, *, slicer: str | None = "brics", randomize: bool = False,
                           seed: int | None = None) -> str:
    """One SMILES in bracket SAFE: `jaxdllm.molecules.safe_text.smiles_to_safe` (BRICS cuts, stereo ignored),
    then `safe_to_bracket`. `randomize`: one random view (atom order and fragment order shuffled, `seed`),
    as GenMol V2's training collator writes each molecule; otherwise the canonical string."""
    from jaxdllm.molecules.safe_text import smiles_to_safe

    return safe_to_bracket(smiles_to_safe(smiles, slicer=slicer, randomize=randomize, seed=seed))


def read_safe_format(folder) -> str:
    """The `safe_format` a model folder's (or data folder's) `FORMAT_FILE` names; `"safe"` when it has none."""
    file = Path(folder) / FORMAT_FILE
    if not file.is_file():
        return "safe"
    try:
        return check_format(json.loads(file.read_text()).get("safe_format", "safe"))
    except (ValueError, AttributeError) as error:  # not JSON, not an object, or not a known format
        raise InputError(f"{file}: {error}") from None


def write_safe_format(folder, safe_format: str):
    """Write `FORMAT_FILE` into `folder` (created); returns its path."""
    file = Path(folder) / FORMAT_FILE
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"safe_format": check_format(safe_format)}) + "\n")
    return file


def to_format(safe_string: str, safe_format: str) -> str:
    """A plain SAFE string written in `safe_format` (a model's text)."""
    return safe_to_bracket(safe_string) if check_format(safe_format) == "bracket" else safe_string


def from_format(text: str, safe_format: str) -> str:
    """A model's text in `safe_format` as plain SAFE (what `safe_text.safe_to_smiles` decodes)."""
    return bracket_to_safe(text) if check_format(safe_format) == "bracket" else text


__all__ = ["FORMAT_FILE", "SAFE_FORMATS", "bracket_to_safe", "check_format", "from_format", "read_safe_format",
           "safe_to_bracket", "smiles_to_bracket_safe", "to_format", "write_safe_format"]
