"""Regexes for JSON numbers inside bounds (integers exactly; decimals without exponent).

Bounds are Decimals so 1.1 means 1.1, not its binary float. Each function returns None when no
number satisfies the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from loraplex.grammar.schema.json_text import alt


def _same_length(a: str, b: str) -> str:
    """Digit strings of len(a) == len(b) between a and b inclusive (leading zeros allowed inside)."""
    if a == b:
        return a
    i = 0
    while a[i] == b[i]:
        i += 1
    prefix, a, b = a[:i], a[i:], b[i:]
    n = len(a)
    if n == 1:
        return f"{prefix}[{a}-{b}]"
    rest = n - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"{prefix}[{a[0]}-{b[0]}][0-9]{{{rest}}}"
    parts = [a[0] + _same_length(a[1:], "9" * rest)]
    lo, hi = int(a[0]) + 1, int(b[0]) - 1
    if lo <= hi:
        parts.append(f"[{lo}-{hi}][0-9]{{{rest}}}")
    parts.append(b[0] + _same_length("0" * rest, b[1:]))
    return prefix + alt(parts)


def _natural_range(lo: int, hi: int | None) -> str | None:
    """Canonical decimal numerals (no leading zeros) of the integers in [lo, hi], lo >= 0."""
    if hi is not None and lo > hi:
        return None
    parts = []
    digits = len(str(lo))
    top = hi if hi is not None else None
    start = lo
    while True:
        end_of_len = 10**digits - 1
        end = end_of_len if top is None else min(end_of_len, top)
        if start <= end:
            parts.append(_same_length(str(start), str(end)))
        if top is not None and end >= top:
            break
        digits += 1
        start = 10 ** (digits - 1)
        if top is None:
            parts.append(f"[1-9][0-9]{{{digits - 1},}}")
            break
    return alt(parts) if parts else None


def integer_range(lo: int | None, hi: int | None) -> str | None:
    """JSON integers n with lo <= n <= hi (None = unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if hi is None or hi >= 0:
        r = _natural_range(max(lo, 0) if lo is not None else 0, hi)
        if r is not None:
            parts.append(r)
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        r = _natural_range(mag_lo, None if lo is None else -lo)
        if r is not None:
            parts.append(f"-(?:{r})")
    return alt(parts) if parts else None


def integer_bounds(
    minimum: Decimal | None, maximum: Decimal | None, ex_min: Decimal | None, ex_max: Decimal | None
) -> tuple[int | None, int | None]:
    """Fold (exclusive) decimal bounds into inclusive integer bounds."""
    lo = hi = None
    if minimum is not None:
        lo = math.ceil(minimum)
    if ex_min is not None:
        lo = max(lo, math.floor(ex_min) + 1) if lo is not None else math.floor(ex_min) + 1
    if maximum is not None:
        hi = math.floor(maximum)
    if ex_max is not None:
        hi = min(hi, math.ceil(ex_max) - 1) if hi is not None else math.ceil(ex_max) - 1
    return lo, hi


def _split(x: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    whole = int(x)
    frac = format(x - whole, "f")
    digits = frac.split(".")[1].rstrip("0") if "." in frac else ""
    return whole, digits


@dataclass(frozen=True)
class _Digits:
    """A set of fraction digit strings: whether the empty one (no fraction) is in it, and a regex
    for the non-empty ones (None if there are none)."""

    empty_ok: bool
    nonempty: str | None


class _Fraction:
    """Regex pieces for fraction digits, at most ``cap`` of them in all (None: any number). Each piece is asked
    for with ``used``, the digits already fixed before it; a piece that cannot fit is None."""

    def __init__(self, cap: int | None) -> None:
        self.cap = cap

    def room(self, used: int) -> int | None:
        return None if self.cap is None else self.cap - used

    def run(self, digit: str, used: int, least: int = 0) -> str | None:
        """``least`` or more of ``digit`` (a regex atom), within the cap."""
        room = self.room(used)
        if room is None:
            return digit + ("*" if least == 0 else "+" if least == 1 else f"{{{least},}}")
        if room < least:
            return None
        return digit + f"{{{least},{room}}}" if room else ("" if least == 0 else None)

    def nonzero(self, used: int) -> str | None:
        """Digit strings holding a digit other than 0."""
        room = self.room(used)
        if room is None:
            return "[0-9]*[1-9][0-9]*"
        parts = [  # by the number j of zeros before the first other digit
            (f"0{{{j}}}" if j else "") + "[1-9]" + (self.run("[0-9]", used + j + 1) or "") for j in range(room)
        ]
        return alt(parts) if parts else None


def _after(digit: str, rest: _Digits) -> str | None:
    """Regex for `digit` followed by a member of `rest`."""
    if rest.nonempty is None:
        return digit if rest.empty_ok else None
    return digit + (f"(?:{rest.nonempty})?" if rest.empty_ok else rest.nonempty)


def _fits(fr: _Fraction, text: str, used: int) -> bool:
    room = fr.room(used)
    return room is None or len(text) <= room


def _ge(f: str, strict: bool, fr: _Fraction, used: int = 0) -> _Digits:
    """Fractions d with 0.d >= 0.f (> when strict); f has no trailing zeros."""
    if not f:
        return _Digits(not strict, fr.nonzero(used) if strict else fr.run("[0-9]", used, 1))
    parts: list[str | None] = []
    for i, ch in enumerate(f):
        if ch != "9" and _fits(fr, f[:i] + "x", used):
            tail = fr.run("[0-9]", used + i + 1)
            parts.append(None if tail is None else f"{f[:i]}[{int(ch) + 1}-9]{tail}")
    if _fits(fr, f, used):
        tail = fr.nonzero(used + len(f)) if strict else fr.run("[0-9]", used + len(f))
        parts.append(None if tail is None else f + tail)
    kept = [p for p in parts if p is not None]
    return _Digits(False, alt(kept) if kept else None)


def _le(f: str, strict: bool, fr: _Fraction, used: int = 0) -> _Digits:
    """Fractions d with 0.d <= 0.f (< when strict); f has no trailing zeros."""
    if not f:
        return _Digits(not strict, None if strict else fr.run("0", used, 1))
    parts: list[str | None] = []
    for i, ch in enumerate(f):
        if ch != "0" and _fits(fr, f[:i] + "x", used):
            tail = fr.run("[0-9]", used + i + 1)
            parts.append(None if tail is None else f"{f[:i]}[0-{int(ch) - 1}]{tail}")
    for k in range(1, len(f)):
        if _fits(fr, f[:k], used):
            tail = fr.run("0", used + k)
            parts.append(None if tail is None else f"{f[:k]}{tail}")
    if not strict and _fits(fr, f, used):
        tail = fr.run("0", used + len(f))
        parts.append(None if tail is None else f + tail)
    kept = [p for p in parts if p]
    return _Digits(True, alt(kept) if kept else None)


def _window(a: str, a_strict: bool, b: str, b_strict: bool, fr: _Fraction, used: int = 0) -> _Digits:
    """Fractions d with 0.a <=(<) 0.d <=(<) 0.b, where 0.a < 0.b (no trailing zeros)."""
    if not _fits(fr, "x", used):
        return _Digits(not a and not a_strict, None)
    if a and a[0] == b[0]:
        return _Digits(False, _after(a[0], _window(a[1:], a_strict, b[1:], b_strict, fr, used + 1)))
    if not a and b[0] == "0":
        inner = _window("", a_strict, b[1:], b_strict, fr, used + 1)
        return _Digits(not a_strict, _after("0", inner))
    parts = []
    if a:
        first = int(a[0])
        parts.append(_after(a[0], _ge(a[1:], a_strict, fr, used + 1)))
        empty_ok = False
    else:
        first = 0
        parts.append(_after("0", _ge("", a_strict, fr, used + 1)))
        empty_ok = not a_strict
    last = int(b[0])
    if first + 1 <= last - 1:
        parts.append(f"[{first + 1}-{last - 1}]{fr.run('[0-9]', used + 1)}")
    parts.append(_after(b[0], _le(b[1:], b_strict, fr, used + 1)))
    kept = [p for p in parts if p is not None]
    return _Digits(empty_ok, alt(kept) if kept else None)


def _with_fraction(whole: str, digits: _Digits) -> str | None:
    if digits.nonempty is None:
        return whole if digits.empty_ok else None
    frac = rf"\.(?:{digits.nonempty})"
    return whole + (f"(?:{frac})?" if digits.empty_ok else frac)


def _nonneg_decimal(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool, fr: _Fraction) -> str | None:
    """Decimals x >= 0 with lo <=(<) x <=(<) hi, spelled without exponent."""
    if hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict))):
        return None
    lo_i, lo_f = _split(lo)
    if hi is not None:
        hi_i, hi_f = _split(hi)
        if lo == hi:
            if not _fits(fr, lo_f, 0):
                return None
            zeros = fr.run("0", len(lo_f), 0 if lo_f else 1)
            return _with_fraction(str(lo_i), _Digits(not lo_f, None if zeros is None else lo_f + zeros))
        if lo_i == hi_i:
            return _with_fraction(str(lo_i), _window(lo_f, lo_strict, hi_f, hi_strict, fr))
    parts = [_with_fraction(str(lo_i), _ge(lo_f, lo_strict, fr))]
    middle = _natural_range(lo_i + 1, None if hi is None else hi_i - 1)
    if middle is not None:
        digits = fr.run("[0-9]", 0, 1)
        parts.append(middle + (rf"(?:\.{digits})?" if digits else ""))
    if hi is not None:
        parts.append(_with_fraction(str(hi_i), _le(hi_f, hi_strict, fr)))
    kept = [p for p in parts if p is not None]
    return alt(kept) if kept else None


def decimal_range(
    lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool, fraction_digits: int | None = None
) -> str | None:
    """JSON numbers (no exponent) x with lo <=(<) x <=(<) hi, with at most ``fraction_digits`` fraction digits
    (None: any); None bounds are open."""
    fr = _Fraction(fraction_digits)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict))):
        return None
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_strict):
        nn_lo, nn_strict = (lo, lo_strict) if lo is not None and lo >= 0 else (Decimal(0), False)
        r = _nonneg_decimal(nn_lo, nn_strict, hi, hi_strict, fr)
        if r is not None:
            parts.append(r)
    if lo is None or lo < 0:
        # negative x: magnitude in (max(-hi, 0), -lo], never zero (zero is written without '-')
        if hi is not None and hi < 0:
            m_lo, m_lo_strict = -hi, hi_strict
        else:
            m_lo, m_lo_strict = Decimal(0), True
        m_hi, m_hi_strict = (None, False) if lo is None else (-lo, lo_strict)
        r = _nonneg_decimal(m_lo, m_lo_strict, m_hi, m_hi_strict, fr)
        if r is not None:
            parts.append(f"-(?:{r})")
    return alt(parts) if parts else None
