"""Final answers written as `#### <number>` (GSM8K and the templated word problems)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_FINAL = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")


def extract_final_answer(text: str) -> str | None:
    """The number after the last `####` in `text`, commas removed (`"#### 1,000"` -> `"1000"`).

    Returns None when there is no `####` followed by a number.
    """
    found = _FINAL.findall(text)
    if not found:
        return None
    number = found[-1].replace(",", "")
    return number[1:] if number.startswith("+") else number


def same_number(a: str | None, b: str | None) -> bool:
    """Whether two numbers written as text are equal (`"72"` == `"72.0"`); False if either is not one."""
    if a is None or b is None:
        return False
    try:
        return Decimal(a.replace(",", "")) == Decimal(b.replace(",", ""))
    except InvalidOperation:
        return False


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")


def final_number(text: str) -> str | None:
    """The answer a generated solution gives: the number after its last `####`, else the last
    number anywhere in it (commas removed, a trailing full stop dropped); None if it has none.

    This is how GSM8K evaluations of instruct models read free-form answers
    (`"... so she earns $18."` -> `"18"`).
    """
    marked = extract_final_answer(text)
    if marked is not None:
        return marked
    found = _NUMBER.findall(text)
    if not found:
        return None
    number = found[-1].replace(",", "")
    return number[1:] if number.startswith("+") else number
