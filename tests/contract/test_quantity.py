"""Kubernetes quantities: worked examples, every error, and agreement with a reference from the grammar."""

from __future__ import annotations

import decimal
import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.contract import quantity


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("1000M", 954),
        ("1Gi", 1024),
        ("1.5Gi", 1536),
        (".5Gi", 512),
        ("512Mi", 512),
        ("1G", 954),
        ("1e9", 954),
        ("1E9", 954),
        ("1e3", 1),  # 1000 bytes round up to one MiB
        ("+2Gi", 2048),
        ("1048576", 1),
        ("1048577", 2),
        ("1m", 1),  # a milli-byte still rounds up to one MiB
        ("5.", 1),
        ("0.001Ti", 1049),
        ("1Ki", 1),
        ("2E", 1907348632813),
        ("1Ei", 2**40),
    ],
)
def test_quantity_mib_rounds_up(text: str, mib: int) -> None:
    assert quantity.quantity_mib(text) == mib


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1k", Fraction(1000)),
        ("-1e-3", Fraction(-1, 1000)),
        ("10m", Fraction(1, 100)),
    ],
)
def test_parse_quantity_is_exact(text: str, value: Fraction) -> None:
    assert quantity.parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Gi",
        "1 Gi",
        " 1Gi",
        "1Gi ",
        "1gi",
        "1K",
        "1e",
        "1e3Gi",
        "1.2.3",
        "--1",
        "1/2",
        "0x10",
        "inf",
        "1_000",
    ],
)
def test_parse_quantity_rejects_text_outside_the_grammar(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"^not a Kubernetes quantity \(for example 8Gi, 512Mi, 1G or 1e9\)$"
    ):
        quantity.parse_quantity(text)


def test_exponent_far_beyond_any_memory_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^exponent out of range \(at most 64 either way\)$"):
        quantity.parse_quantity("1e65")


@pytest.mark.parametrize("text", ["0", "0Gi", "-1Gi", "-0.5"])
def test_memory_below_one_mib_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^must be at least 1 MiB$"):
        quantity.quantity_mib(text)


@pytest.mark.parametrize(
    ("text", "value"), [("0.25", Fraction(1, 4)), (".5", Fraction(1, 2)), ("5e-1", Fraction(1, 2))]
)
def test_parse_decimal(text: str, value: Fraction) -> None:
    assert quantity.parse_decimal(text) == value


@pytest.mark.parametrize("text", ["", "half", "0.5Gi", "1k", "1/2"])
def test_parse_decimal_rejects_units_and_words(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not a decimal number \(for example 0.25\)$"):
        quantity.parse_decimal(text)


@pytest.mark.parametrize(("text", "mib"), [("20480", 20480), ("+1", 1), ("20Gi", 20480), ("1000M", 954)])
def test_kai_memory_bare_integer_is_mib_and_units_are_quantities(text: str, mib: int) -> None:
    assert quantity.kai_memory_mib(text) == mib


@pytest.mark.parametrize("text", ["1.5", "2e3", ".5"])
def test_kai_memory_refuses_a_unitless_number_that_is_not_whole(text: str) -> None:
    with pytest.raises(ValueError, match=r"^a number without a unit means MiB and must be whole; add a unit"):
        quantity.kai_memory_mib(text)


@pytest.mark.parametrize("text", ["0", "-5", "0Mi"])
def test_kai_memory_below_one_mib_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^must be at least 1 MiB$"):
        quantity.kai_memory_mib(text)


def test_format_mib() -> None:
    assert quantity.format_mib(20480) == "20480Mi"
    assert quantity.quantity_mib(quantity.format_mib(954)) == 954


# A reference parser written straight from the grammar in the Kubernetes API docs, sharing nothing with the
# implementation: the alternatives are spelled out one by one and arithmetic is done with Decimal.
_REFERENCE = re.compile(
    r"(?P<sign>\+|-)?"
    r"(?P<number>[0-9]+|[0-9]+\.[0-9]+|[0-9]+\.|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|(?:e|E)(?:\+|-)?[0-9]+)?"
)
_REFERENCE_FACTORS = {
    None: 1,
    "m": decimal.Decimal("0.001"),
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "E": 1000**6,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}


def _reference_mib(text: str) -> int | None:
    """MiB rounded up, or None where the grammar (or the 1 MiB floor, or the exponent bound) refuses it."""
    match = _REFERENCE.fullmatch(text)
    if match is None:
        return None
    with decimal.localcontext() as context:
        context.prec = 400
        value = decimal.Decimal(match["number"])
        suffix = match["suffix"]
        if suffix in _REFERENCE_FACTORS:
            value *= _REFERENCE_FACTORS[suffix]
        else:
            exponent = int(suffix[1:])
            if abs(exponent) > quantity.MAX_EXPONENT:
                return None
            value = value.scaleb(exponent)
        if match["sign"] == "-":
            value = -value
        mib = int((value / 1024**2).to_integral_value(rounding=decimal.ROUND_CEILING))
    return mib if mib >= 1 else None


def _implementation_mib(text: str) -> int | None:
    try:
        return quantity.quantity_mib(text)
    except ValueError:
        return None


_DIGITS = st.text(alphabet="0123456789", max_size=12)
_SUFFIXES = st.sampled_from(
    ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E", "K", "i", "e", "mi"]
)
_EXPONENTS = st.builds(
    lambda letter, sign, number: f"{letter}{sign}{number}",
    st.sampled_from(["e", "E"]),
    st.sampled_from(["", "+", "-"]),
    st.integers(min_value=0, max_value=80),
)
_NEAR_QUANTITIES = st.builds(
    lambda sign, whole, dot, frac, suffix: f"{sign}{whole}{dot}{frac}{suffix}",
    st.sampled_from(["", "+", "-", "--"]),
    _DIGITS,
    st.sampled_from(["", ".", ".."]),
    _DIGITS,
    _SUFFIXES | _EXPONENTS,
)


@given(_NEAR_QUANTITIES | st.text(alphabet="0123456789.+-eEkKmMGTPi ", max_size=12))
def test_quantity_parser_agrees_with_the_grammar(text: str) -> None:
    assert _implementation_mib(text) == _reference_mib(text)


# Digits: ASCII only, and a bounded number of them (issue 11).

NON_ASCII_NUMBERS = [
    "\uff10.\uff15",
    "\u0660\u066b\u0665",
    ".\u0665",
    "\u0661",
    "\u0665Gi",
    "1\u0665Mi",
    "1e\u0663",
    "\u00b2",
    "\U0001d7cfGi",
    "1\u00a0Gi",
]


@pytest.mark.parametrize("text", NON_ASCII_NUMBERS)
def test_digits_of_other_scripts_are_not_numbers(text: str) -> None:
    for parse in (quantity.parse_quantity, quantity.parse_decimal, quantity.kai_memory_mib):
        with pytest.raises(ValueError):
            parse(text)
    with pytest.raises(ValueError, match=r"^must be a positive whole number$"):
        quantity.positive_count(text)


@given(st.text(min_size=1, max_size=12).filter(lambda text: not text.isascii()))
def test_no_text_with_a_character_outside_ascii_is_a_number(text: str) -> None:
    for parse in (
        quantity.parse_quantity,
        quantity.parse_decimal,
        quantity.kai_memory_mib,
        quantity.positive_count,
    ):
        with pytest.raises(ValueError):
            parse(text)


@pytest.mark.parametrize(
    "text", ["1" * 65, "0." + "1" * 64, "1e" + "0" * 64 + "1", "9" * 5000, "9" * 5000 + "Gi", "+" + "1" * 65]
)
def test_a_number_of_more_than_max_digits_is_refused_before_it_is_converted(text: str) -> None:
    for parse in (quantity.parse_quantity, quantity.kai_memory_mib):
        with pytest.raises(ValueError, match=r"digits, more than 64$"):
            parse(text)


def test_counts_are_ascii_positive_whole_numbers_of_bounded_length() -> None:
    assert quantity.positive_count("2") == 2
    assert quantity.positive_count("0" * 63 + "1") == 1
    for text in ("0", "-1", "+1", "1.0", "", " 1", "2\n"):
        with pytest.raises(ValueError, match=r"^must be a positive whole number$"):
            quantity.positive_count(text)
    with pytest.raises(ValueError, match=r"^has 5000 digits, more than 64$"):
        quantity.positive_count("1" * 5000)
