r"""Kubernetes quantities and plain decimals, parsed exactly.

Memory limits are enforced to the MiB, so a float's rounding could hand a tenant one MiB more or less than
the scheduler counted; every value is therefore a `Fraction`. The functions raise `ValueError` whose message
reads as a rule ("must be at least 1 MiB"), and the parser turns it into a `ContractError` naming the key.

The grammar is Kubernetes' own:

    quantity  ::= sign? number suffix?
    number    ::= digits | digits "." digits? | "." digits
    suffix    ::= "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"        (binary SI)
                | "m" | "k" | "M" | "G" | "T" | "P" | "E"      (decimal SI; "m" is milli)
                | ("e" | "E") sign? digits                      (decimal exponent)
    digit     ::= "0" | "1" | ... | "9"                           (ASCII only)

Digits are ASCII only, as Kubernetes and KAI read them: Python's `int` and `re`'s `\d` also take other
scripts' digits (fullwidth `"\uff10.\uff15"` would read as 0.5), so no pattern here uses `\d`, and every
reader of the contract gets the same refusal. A number has at most `MAX_DIGITS` digits, so that no text
makes `int` or `Fraction` work on a huge integer (nor hits Python's limit on converting one).
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

MIB = 2**20

# An exponent beyond this is a typo, not a memory size, and would make Fraction build a huge integer.
MAX_EXPONENT = 64
# Digits in a number, before and after the point together: far more than any GPU size or count needs.
MAX_DIGITS = 64

_SUFFIX_FACTORS: dict[str, Fraction] = {
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[mkMGTPE]))?"
)
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_WHOLE = re.compile(r"[0-9]+")

_NOT_A_QUANTITY = "not a Kubernetes quantity (for example 8Gi, 512Mi, 1G or 1e9)"
_NOT_A_DECIMAL = "not a decimal number (for example 0.25)"


def _parse(text: str, *, expected: str = _NOT_A_QUANTITY) -> tuple[Fraction, str | None]:
    """The number (exponent applied) and the SI suffix, if any; `expected` is the message for a mismatch."""
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match["whole"] or match["frac"]):
        raise ValueError(expected)
    _check_digits(match["whole"] + (match["frac"] or ""))
    if match["exponent"] is not None:
        _check_digits(match["exponent"].lstrip("+-"))
    digits = match["frac"] or ""
    value = Fraction(int(match["whole"] + digits or "0"), 10 ** len(digits))
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"exponent out of range (at most {MAX_EXPONENT} either way)")
        value *= Fraction(10) ** exponent
    return (-value if match["sign"] == "-" else value), match["suffix"]


def _check_digits(digits: str) -> None:
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"has {len(digits)} digits, more than {MAX_DIGITS}")


def positive_count(text: str) -> int:
    """A count of at least 1, written in ASCII digits only (at most `MAX_DIGITS` of them)."""
    if not _WHOLE.fullmatch(text):
        raise ValueError("must be a positive whole number")
    _check_digits(text)
    if int(text) < 1:
        raise ValueError("must be a positive whole number")
    return int(text)


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity: `1.5Gi` is 1610612736, `1e3` and `1k` are 1000.

    Memoized: a relist parses every pod's requests, and a cluster's pods repeat a few hundred quantities
    (`100m`, `4Gi`); a Fraction is immutable, and a refused text raises again without being cached."""
    number, suffix = _parse(text)
    return number * _SUFFIX_FACTORS[suffix] if suffix else number


def parse_decimal(text: str) -> Fraction:
    """The exact value of a plain decimal such as `0.25`, `.5` or `5e-1`, as `gpu-fraction` takes."""
    number, suffix = _parse(text, expected=_NOT_A_DECIMAL)
    if suffix:
        raise ValueError(_NOT_A_DECIMAL)
    return number


def bytes_to_mib(value: Fraction) -> int:
    """Bytes rounded *up* to whole MiB, so a share never gets less than it asked for; at least 1 MiB."""
    mib = math.ceil(value / MIB)
    if mib < 1:
        raise ValueError("must be at least 1 MiB")
    return mib


def quantity_mib(text: str) -> int:
    """A memory quantity in whole MiB, as the NVIDIA keys take it: a bare number is bytes."""
    return bytes_to_mib(parse_quantity(text))


def kai_memory_mib(text: str) -> int:
    """The KAI `gpu-memory` value in whole MiB: a bare whole number is MiB, a value with a unit a quantity.

    A unitless value that is not a whole number (`1.5`, `2e3`) is refused rather than guessed at, since KAI
    reads it as MiB and Kubernetes as bytes: the two readings differ a millionfold.
    """
    if _WHOLE_NUMBER.fullmatch(text):
        _check_digits(text.lstrip("+-"))
        mib = int(text)
        if mib < 1:
            raise ValueError("must be at least 1 MiB")
        return mib
    number, suffix = _parse(text)
    if not suffix:
        raise ValueError("a number without a unit means MiB and must be whole; add a unit, as in 1536Mi")
    return bytes_to_mib(number * _SUFFIX_FACTORS[suffix])


def format_mib(mib: int) -> str:
    """The quantity the scheduler writes for a resolved size: `<n>Mi`."""
    return f"{mib}Mi"
