"""``multipleOf`` where the grammar cannot simply state it: as validators judge it, and within automaton size.

jsonschema (like most validators) divides by a float divisor in binary floating point: 2.47 / 0.01 is
246.99999999999997, so 2.47 "is not a multiple of 0.01" although it is one in decimal, and 13% of the
two-decimal numbers fail so. A grammar that generates every decimal multiple would emit documents the validator
rejects. And llguidance states a multiple as a divisibility automaton over the divisor's decimal digits, whose
size, and build time, grow steeply with them (bench/README.md has the times), and from 10**9 it gives up.
So:

* a divisor with an exact binary value (0.5, 0.25, integers) and few digits divides exactly: nothing changes;
* a divisor ``d = a/b`` (lowest terms) whose double is within a relative 2**-54 of it (0.1, 0.01, 0.3, 1e-6):
  the integer multiples ``n*a`` pass. Their quotient is the integer ``n*b``, and the double division's
  relative error (at most |d - double(d)| / d) stays within half a unit in the last place of any integer
  below 2**53 (above it every double is an integer; an overflowing quotient is judged exactly);
* any other divisor (0.07, 1e-5: even 1 / 1e-5 fails), and any whose automaton would be too large (123456,
  2**-30): the multiples nearest the bound closest to zero that pass the validator's own test, at most
  MAX_VALUES of them.

All but the first are narrowings, reported; numbers stay multiples in decimal too, so no validator is given less.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

MAX_VALUES = 64  # values kept where no whole family of multiples can be stated
MAX_TRIES = 20_000  # multiples tried to find them
MAX_AUTOMATON_DIGITS = 20_000  # the largest divisor significand (trailing zeros aside) stated as an automaton
MAX_SIGNIFICAND = 10**8  # llguidance refuses from about here ("too many digits", "parser too complex")
LARGEST = 2**53  # values beyond are not generated (JSON parsers differ on them; jsonschema's floats round)
NON_NUMBERS = ["null", "boolean", "string", "array", "object"]

Plan = tuple[tuple[str, Any], str]  # (("integer", a) | ("values", [...]), how it narrows)


def passes(value: int | float, divisor: int | float) -> bool:
    """jsonschema's multipleOf test (floating-point division for a float divisor, exact on overflow)."""
    if not isinstance(divisor, float):
        return value % divisor == 0
    quotient = value / divisor
    try:
        return int(quotient) == quotient
    except OverflowError:
        return (Fraction(value) / Fraction(divisor)).denominator == 1


def narrowed_multiple(divisor: int | float, node: dict[str, Any]) -> Plan | None:
    """What replaces ``multipleOf: divisor`` in ``node`` (None: nothing to change): ``("integer", a)`` for
    integer multiples of ``a``, or ``("values", [...])`` for a finite list; with how it narrows."""
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or not math.isfinite(divisor):
        return None
    if divisor <= 0:
        return None  # not a valid schema: check_schema names it
    decimal = _exact(divisor)
    error = abs(Fraction(divisor) - decimal) / decimal
    if error == 0:
        if _stateable(decimal):
            return None
        return _values(divisor, decimal, node, f"{divisor} has too many digits for a divisibility automaton")
    if error <= Fraction(1, 2**54):
        a = decimal.numerator
        if _stateable(Fraction(a)):
            return ("integer", a), f"{divisor} has no exact binary value: only integer multiples of {a} are generated"
        return _values(
            divisor, Fraction(a), node, f"{divisor} has no exact binary value and {_short(a)} too many digits"
        )
    return _values(
        divisor,
        decimal,
        node,
        f"{divisor} has no exact binary value and validators dividing in floating point reject most of its multiples",
    )


def _short(n: int) -> str:
    return str(n) if n < 10**16 else f"{n:.6e}"


def _stateable(step: Fraction) -> bool:
    """Whether llguidance builds the divisibility automaton for this divisor quickly: its decimal significand,
    trailing zeros aside (they only ask for zeros at the end), is small."""
    significand: int = step.numerator * 10 ** _decimal_places(step.denominator) // step.denominator
    if significand >= MAX_SIGNIFICAND:
        return False
    while significand % 10 == 0:
        significand //= 10
    return significand <= MAX_AUTOMATON_DIGITS


def _decimal_places(denominator: int) -> int:
    """Digits after the point of p/denominator in lowest terms (a terminating decimal: 2**x * 5**y)."""
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    assert denominator == 1, "a JSON number is a terminating decimal"
    return max(twos, fives)


def _values(divisor: int | float, step: Fraction, node: dict[str, Any], why: str) -> Plan:
    values = _passing_values(divisor, step, node)
    shown = ", ".join(map(str, values[:4])) + (", ..." if len(values) > 4 else "")
    return ("values", values), f"{why}: only {len(values)} multiples that pass ({shown}) are generated"


def _passing_values(divisor: int | float, step: Fraction, node: dict[str, Any]) -> list[int | float]:
    """Multiples k*step (as JSON spells them) inside the node's own bounds and +-LARGEST that pass, nearest the
    bound closest to zero first (integer multiples only where the node admits integers only)."""
    if node.get("type") in ("integer", ["integer"]):
        step = Fraction(step.numerator)
    lo, hi = _window(node)
    k_lo, k_hi = math.ceil(lo / step), math.floor(hi / step)
    out: list[int | float] = []
    if k_lo > k_hi:
        return out
    start = min(max(0, k_lo), k_hi)
    nearest_first = itertools.chain(
        [start], itertools.chain.from_iterable((start + i, start - i) for i in itertools.count(1))
    )
    for k in itertools.islice(nearest_first, MAX_TRIES):
        if not k_lo <= k <= k_hi:
            continue
        value = _spelled(k * step)
        if value is not None and _inside(value, node) and passes(value, divisor):
            out.append(value)
            if len(out) >= MAX_VALUES:
                break
    return sorted(set(out))


def _spelled(value: Fraction) -> int | float | None:
    """The JSON number for an exact decimal: an int, or the double whose shortest spelling it is."""
    if value.denominator == 1:
        return int(value)
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    number = float(text)
    return number if Fraction(repr(number)) == value else None


def _exact(number: int | float) -> Fraction:
    """A JSON number's decimal value (a float's as written: its shortest spelling)."""
    return Fraction(repr(number)) if isinstance(number, float) else Fraction(number)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _window(node: dict[str, Any]) -> tuple[Fraction, Fraction]:
    """Where to look for multiples: the node's bounds (exclusive ones too: _inside decides) within +-LARGEST."""
    lows = [_exact(node[k]) for k in ("minimum", "exclusiveMinimum") if _is_number(node.get(k))]
    highs = [_exact(node[k]) for k in ("maximum", "exclusiveMaximum") if _is_number(node.get(k))]
    return max([Fraction(-LARGEST), *lows]), min([Fraction(LARGEST), *highs])


def _inside(value: int | float, node: dict[str, Any]) -> bool:
    """The node's own numeric bounds, as a validator compares them."""
    checks: tuple[tuple[str, Callable[[Any], bool]], ...] = (
        ("minimum", lambda b: value >= b),
        ("exclusiveMinimum", lambda b: value > b),
        ("maximum", lambda b: value <= b),
        ("exclusiveMaximum", lambda b: value < b),
    )
    return all(not _is_number(node.get(key)) or ok(node[key]) for key, ok in checks)
