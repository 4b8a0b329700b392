"""Numbers as Kubernetes writes them: the one resource-quantity parser, with a strict and a lenient policy.

Only ASCII digits are numbers here (`٢`, `２`, `२` are not 2). Never guess: a value parses exactly
or raises `QuantityError` naming what is accepted; the lenient policy records that message and moves on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypeVar

T = TypeVar("T")

# Kubernetes' grammar: a signed decimal number, then either a decimal exponent or a suffix (never both).
# Exponents are limited to 3 digits so that "1e99999999" is refused instead of computed.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:[eE](?P<exp>[+-]?[0-9]{1,3})|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?",
    re.ASCII,
)
SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
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
ACCEPTED = (
    "a number written with ASCII digits and an optional suffix (n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, "
    "Pi, Ei) or exponent (e3), e.g. 500m, 2, 4Gi, 1G, 1e3"
)
MIB = 2**20


class QuantityError(ValueError):
    """A Kubernetes resource quantity that does not parse."""


# ------------------------------------------------------------------------------------- the strict policy


def parse_quantity(value: Any) -> Fraction:
    """Exact value of a Kubernetes quantity ('500m', '2', '4Gi', '1G', '128974848', '1e3', '.5', 3, 0.25).

    Raises `QuantityError` (and nothing else) for anything else, its message naming the value and the
    accepted forms. Signs are accepted, as Kubernetes does; callers that need a non-negative value check."""
    if type(value) is str and len(value) <= _CACHED_TEXT:
        return _cached_text_quantity(value)
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r}: expected {ACCEPTED}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return _text_quantity(repr(value), value)  # '0.25', '1e+20'; 'nan' and 'inf' are refused
    if isinstance(value, str):
        return _text_quantity(value)
    raise QuantityError(f"quantity {value!r}: expected {ACCEPTED}")


_CACHED_TEXT = 64  # spellings up to this long are remembered; longer ones (never real quantities) are not


# every admission checks each of its containers' quantities ("500m", "8Gi"), and they repeat across pods:
# each spelling is parsed once (a Fraction is immutable, so the one value is shared; errors are not cached)
@lru_cache(maxsize=4096)
def _cached_text_quantity(text: str) -> Fraction:
    return _text_quantity(text)


def _text_quantity(text: str, value: Any = None) -> Fraction:
    value = text if value is None else value
    value_text = text.strip()
    match = _QUANTITY.fullmatch(value_text)
    if not match or not (match["int"] or match["frac"]):
        raise QuantityError(f"quantity {value!r}: expected {ACCEPTED}")
    digits, frac = match["int"] or "", match["frac"] or ""
    try:
        number = Fraction(int(digits + frac or "0"), 10 ** len(frac))
    except ValueError:  # more digits than Python converts (sys.int_info.default_max_str_digits)
        raise QuantityError(f"quantity {value!r}: too many digits; expected {ACCEPTED}") from None
    if match["sign"] == "-":
        number = -number
    if match["exp"] is not None:
        return number * Fraction(10) ** int(match["exp"])
    return number * SUFFIXES[match["suffix"] or ""]


def _scaled(value: Any, scale: Fraction, round_up: bool) -> int:
    q = parse_quantity(value) * scale
    return math.ceil(q) if round_up else math.floor(q)


# quantities repeat across pods ("500m", "4Gi"): parse each spelling once
@lru_cache(maxsize=4096)
def _cpu_text(text: str, round_up: bool) -> int:
    return _scaled(text, Fraction(1000), round_up)


@lru_cache(maxsize=4096)
def _mib_text(text: str, round_up: bool) -> int:
    return _scaled(text, Fraction(1, MIB), round_up)


@lru_cache(maxsize=1024)
def _count_text(text: str) -> int:
    return _scaled(text, Fraction(1), True)


def cpu_milli(value: Any, round_up: bool = True) -> int:
    """A cpu quantity in millicores (requests round up, capacity rounds down)."""
    if isinstance(value, str):
        return _cpu_text(value, round_up)
    return _scaled(value, Fraction(1000), round_up)


def memory_mib(value: Any, round_up: bool = True) -> int:
    """A memory quantity (bytes) in MiB (requests round up, capacity rounds down)."""
    if isinstance(value, str):
        return _mib_text(value, round_up)
    return _scaled(value, Fraction(1, MIB), round_up)


def count(value: Any) -> int:
    """A countable resource (nvidia.com/gpu), rounded up."""
    if isinstance(value, str):
        return _count_text(value)
    return _scaled(value, Fraction(1), True)


def ascii_int(value: Any) -> int:
    """`int(value)`, except that text must be ASCII (Python's `int` reads '٣' and '３' as 3) and that
    overflow (JSON `Infinity`) is a ValueError like any other bad number."""
    if isinstance(value, str) and not value.isascii():
        raise ValueError(f"{value!r} is not an integer written with ASCII digits 0-9")
    try:
        return int(value)
    except OverflowError:
        raise ValueError(f"{value!r} is not a finite integer") from None


def ascii_float(value: Any) -> float:
    """`float(value)`, except that text must be ASCII (Python's `float` reads '١.٥' as 1.5)."""
    if isinstance(value, str) and not value.isascii():
        raise ValueError(f"{value!r} is not a number written with ASCII digits 0-9")
    return float(value)


# ------------------------------------------------------------------------------------ the lenient policy


def parse_or_default(
    parse: Callable[[Any], T], value: Any, default: T, problems: list[str] | None, what: str
) -> T:
    """`parse(value)`, or `default` when the value is absent (None) or does not parse.

    For cluster objects (nodes, running pods), where one bad field must not drop the whole object: the
    problem is appended to `problems` (when given) as "`what`: why", and the default stands in."""
    if value is None:
        return default
    try:
        return parse(value)
    except (ValueError, TypeError) as err:  # QuantityError is a ValueError
        if problems is not None:
            problems.append(f"{what}: {err}")
        return default
