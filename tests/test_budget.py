"""Tests for remat_opt._budget (byte-count parsing/formatting) and its errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from remat_opt._budget import format_bytes, parse_bytes
from remat_opt._errors import (
    InfeasibleBudgetError,
    InvalidBudgetError,
    InvalidBudgetTypeError,
    RematOptError,
    UnsupportedProgramError,
)

ACCEPTED = [
    (4096, 4096),
    (1, 1),
    (np.int64(4096), 4096),
    (np.int32(7), 7),
    (8 * 2**30 * 1.0, 8 * 2**30),
    (np.float32(1024.0), 1024),
    ("4096", 4096),
    ("512MiB", 512 * 2**20),
    ("2GB", 2 * 10**9),
    ("1.5 GiB", 3 * 2**29),
    ("64 kB", 64_000),
    ("64 KB", 64_000),
    ("64kb", 64_000),
    ("3 KiB", 3 * 1024),
    ("3 kib", 3 * 1024),
    ("1 TB", 10**12),
    ("1TiB", 2**40),
    ("7 MB", 7 * 10**6),
    ("7 mib", 7 * 2**20),
    ("100B", 100),
    ("100 b", 100),
    ("100 bytes", 100),
    ("  42  ", 42),
    ("1_000_000", 1_000_000),
    ("1,000,000", 1_000_000),
    ("1_024 KiB", 2**20),
    ("1e9", 10**9),
    ("2.5e3 B", 2500),
    (".5 KiB", 512),
    ("+8 MiB", 8 * 2**20),
    ("1.0001 KiB", 1024),  # 1024.1024 bytes, rounded down.
    ("0.001 kB", 1),
]


@pytest.mark.parametrize(("value", "expected"), ACCEPTED, ids=repr)
def test_parse_bytes_accepts(value: object, expected: int) -> None:
    result = parse_bytes(value)
    assert result == expected
    assert type(result) is int


REJECTED_VALUES = [
    0,
    -1,
    np.int64(-5),
    0.0,
    -2.0,
    1.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "   ",
    "abc",
    "0",
    "0 MiB",
    "-3MiB",
    "1.5",
    "0.5 B",
    "0.0001 kB",
    "5 K",
    "5 M",
    "5 GBs",
    "5 Mbit",
    "5 PiB",
    "1,,000",
    "1_",
    "_1",
    "1e",
    "nan",
    "inf",
    "12 34",
]


@pytest.mark.parametrize("value", REJECTED_VALUES, ids=repr)
def test_parse_bytes_rejects_value(value: object) -> None:
    with pytest.raises(InvalidBudgetError) as info:
        parse_bytes(value)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, RematOptError)
    message = str(err)
    assert "budget_bytes" in message
    assert repr(value) in message
    assert "512MiB" in message  # An example of a valid value.
    assert err.argument == "budget_bytes"
    assert err.value is value


@pytest.mark.parametrize("value", [True, False, np.bool_(True), None, [1], b"512MiB", 1j])
def test_parse_bytes_rejects_type(value: object) -> None:
    with pytest.raises(InvalidBudgetTypeError) as info:
        parse_bytes(value)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, RematOptError)
    message = str(info.value)
    assert "budget_bytes" in message
    assert repr(value) in message
    assert "'512MiB'" in message


def test_parse_bytes_bool_message_is_explicit() -> None:
    with pytest.raises(TypeError) as info:
        parse_bytes(True)
    assert str(info.value) == (
        "budget_bytes must be an int or a string such as '512MiB'; got True (bool)."
    )


def test_parse_bytes_unknown_unit_lists_valid_units() -> None:
    with pytest.raises(ValueError, match=r"unknown unit 'K'.*kB.*KiB"):
        parse_bytes("5 K")


def test_parse_bytes_names_the_given_argument() -> None:
    with pytest.raises(InvalidBudgetError, match="host_bytes") as info:
        parse_bytes("-1 GiB", argument="host_bytes")
    assert info.value.argument == "host_bytes"
    assert "budget_bytes" not in str(info.value)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (4 * 2**20, "4.00 MiB"),
        (2**20 - 1, "1.00 MiB"),  # Not "1024.00 KiB".
        (3 * 2**29, "1.50 GiB"),
        (2**40, "1.00 TiB"),
        (np.int64(2048), "2.00 KiB"),
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


@pytest.mark.parametrize("n", [1.5, "1", True, None])
def test_format_bytes_rejects_non_int(n: object) -> None:
    with pytest.raises(TypeError, match="n must be an int"):
        format_bytes(n)  # type: ignore[arg-type]


def test_infeasible_budget_error_message() -> None:
    err = InfeasibleBudgetError(1_000_000, 3_200_000, detail="Largest buffer: dot_general.")
    assert isinstance(err, ValueError) and isinstance(err, RematOptError)
    assert (err.budget_bytes, err.min_budget_bytes) == (1_000_000, 3_200_000)
    assert str(err) == (
        "budget_bytes=1,000,000 (976.56 KiB) is below the lowest peak XLA measured for any plan remat_opt "
        "tried for this program at this budget, 3,200,000 bytes (3.05 MiB); pass budget_bytes >= 3200000. "
        "Largest buffer: dot_general."
    )


def test_other_errors() -> None:
    unsupported = UnsupportedProgramError("while", "model.py:12 (step)", "Unroll the loop.")
    assert isinstance(unsupported, NotImplementedError)
    assert str(unsupported) == (
        "remat_opt cannot plan through primitive 'while' (at model.py:12 (step)). "
        "Unroll the loop."
    )


@pytest.mark.parametrize(
    "err",
    [
        InfeasibleBudgetError(10, 20, "x"),
        InfeasibleBudgetError(10, 20, "x", lower_bound=True),
        UnsupportedProgramError("cond", None, "hint"),
        InvalidBudgetError("m", argument="budget_bytes", value="5 K"),
        InvalidBudgetTypeError("m", argument="budget_bytes", value=None),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_survive_pickling(err: RematOptError) -> None:
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert str(copy) == str(err)
    assert vars(copy) == vars(err)
