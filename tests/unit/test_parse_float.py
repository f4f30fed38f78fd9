"""``discovery.http.parse_float``: a query parameter as a plain decimal in a range,
or a 400 naming it (as ``parse_int`` does for integers)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from discovery.errors import BadRequestError
from discovery.http import parse_float


def test_absent_is_the_default() -> None:
    assert parse_float("x", None, 0.25, 0, 1) == 0.25


@pytest.mark.parametrize(
    ("raw", "value"),
    [("0", 0.0), ("1", 1.0), ("0.5", 0.5), (".5", 0.5), ("1.", 1.0), ("+0.75", 0.75), ("-0", 0.0)],
)
def test_plain_decimals_within_the_bounds_are_read(raw: str, value: float) -> None:
    assert parse_float("x", raw, 0.25, 0, 1) == value


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " 1",
        "1 ",
        "1e-3",
        "1E2",
        "inf",
        "-inf",
        "nan",
        "NaN",
        "0x1",
        "1_0",
        "1.2.3",
        "+",
        ".",
        "٣",
        "½",
        "1,5",
    ],
)
def test_anything_but_a_plain_decimal_is_not_a_number(raw: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        parse_float("soft_timeout", raw, 0.0, 0, 1)
    assert (refused.value.parameter, refused.value.reason) == ("soft_timeout", "not_number")
    assert "'soft_timeout' must be a number" in str(refused.value)


def test_more_digits_than_a_double_holds_are_refused_saying_so() -> None:
    with pytest.raises(BadRequestError, match="at most 18 digits") as refused:
        parse_float("x", "0." + "3" * 19, 0.0, 0, 1)
    assert refused.value.reason == "not_number"
    # A long text is never echoed whole.
    assert len(str(refused.value)) < 200
    with pytest.raises(BadRequestError, match="at most 18 digits"):
        parse_float("x", "1" * 5000, 0.0, 0, 1)


@pytest.mark.parametrize("raw", ["-0.01", "1.0001", "100"])
def test_out_of_range_is_refused_naming_the_parameter_and_the_range(raw: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        parse_float("soft_timeout", raw, 0.0, 0, 1)
    assert (refused.value.parameter, refused.value.reason) == ("soft_timeout", "out_of_range")
    assert "'soft_timeout' must be in 0..1" in str(refused.value)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="0123456789.+-e", max_size=25) | st.floats(allow_nan=True).map(str),
    st.floats(-100, 100),
    st.floats(0, 1000),
)
def test_either_a_number_in_range_or_a_named_refusal(raw: str, low: float, span: float) -> None:
    high = low + span
    refused: BadRequestError | None = None
    try:
        value = parse_float("n", raw, 7.0, low, high)
    except BadRequestError as exc:
        refused = exc
    if refused is not None:
        assert refused.parameter == "n"
        assert refused.reason in ("not_number", "out_of_range")
        if refused.reason == "out_of_range":
            assert not low <= float(raw) <= high
        return
    assert re.fullmatch(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", raw)
    assert value == float(raw)
    assert low <= value <= high
