"""Regexes for the string formats we enforce, spelled as JSON string content (quotes excluded).

date, time and date-time follow RFC 3339 (days per month and leap years exact; year 0000 left
out, as Python and most parsers reject it). A leap second
(:60) is exact for UTC offsets (only 23:59:60) but accepted at any minute with a non-zero offset,
a deliberate superset. email follows RFC 5321 (dot-atom or quoted local part; host name or an
address literal); uri is an RFC 3986 absolute URI.
"""

from __future__ import annotations

_HEX = "[0-9a-fA-F]"
_DAY_31 = "(?:0[1-9]|[12][0-9]|3[01])"
_DAY_30 = "(?:0[1-9]|[12][0-9]|30)"
_DAY_28 = "(?:0[1-9]|1[0-9]|2[0-8])"
# Year 0000 is valid RFC 3339 but not a year Python (and most parsers) accept: left out.
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
DATE = f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-{_DAY_31}|(?:0[469]|11)-{_DAY_30}|02-{_DAY_28})|{_LEAP_YEAR}-02-29)"

_FRAC = r"(?:\.[0-9]+)?"
_HOUR = "(?:[01][0-9]|2[0-3])"
_MIN = "[0-5][0-9]"
_ZERO_OFFSET = "(?:[Zz]|[+-]00:00)"
_NONZERO_OFFSET = f"[+-](?:(?:0[1-9]|1[0-9]|2[0-3]):{_MIN}|00:(?:0[1-9]|[1-5][0-9]))"
_OFFSET = f"(?:[Zz]|[+-]{_HOUR}:{_MIN})"
TIME = (
    f"(?:{_HOUR}:{_MIN}:{_MIN}{_FRAC}{_OFFSET}|23:59:60{_FRAC}{_ZERO_OFFSET}|{_HOUR}:{_MIN}:60{_FRAC}{_NONZERO_OFFSET})"
)
DATE_TIME = f"{DATE}[Tt]{TIME}"

UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"


def _ipv6() -> str:
    """RFC 3986's IPv6address: eight groups, or fewer around one '::'."""
    alts = [f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}"]
    for before in range(7):
        after = 4 - before
        head = f"(?:(?:{_H16}:){{0,{before}}}{_H16})?" if before else f"(?:{_H16})?"
        if after >= 0:
            tail = f"(?:{_H16}:){{{after}}}{_LS32}" if after else _LS32
        elif after == -1:
            tail = _H16
        else:
            tail = ""
        alts.append(f"{head}::{tail}")
    return "(?:" + "|".join(alts) + ")"


IPV6 = _ipv6()

# RFC 5321 mailbox. In JSON text a quoted local part's quotes are written \" and a backslash \\.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]"
_DOT_ATOM = rf"{_ATEXT}+(?:\.{_ATEXT}+)*"
_QTEXT = r"[\x20\x21\x23-\x5B\x5D-\x7E]"
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"


def _email(quote: str, backslash: str) -> str:
    """The mailbox regex with the given spellings of '"' and '\\' (raw or JSON-escaped)."""
    qpair = rf"{backslash}(?:{_QTEXT}|{quote}|{backslash})"
    quoted = rf"{quote}(?:{_QTEXT}|{qpair})*{quote}"
    return rf"(?:{_DOT_ATOM}|{quoted})@(?:{_DOMAIN}|\[{IPV4}\]|\[IPv6:{IPV6}\])"


EMAIL = _email(r'\\"', r"\\\\")

# RFC 3986 URI (scheme required).
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = f"%{_HEX}{{2}}"
_PCHAR = f"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_USERINFO = f"(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*"
_IP_LITERAL = rf"\[(?:{IPV6}|v{_HEX}+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]"
_REG_NAME = f"(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"
_AUTHORITY = f"(?:{_USERINFO}@)?(?:{_IP_LITERAL}|{IPV4}|{_REG_NAME})(?::[0-9]*)?"
_PATH_ABEMPTY = f"(?:/{_PCHAR}*)*"
_HIER = f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*|)"
_QUERY = f"(?:{_PCHAR}|[/?])*"
URI = rf"[A-Za-z][A-Za-z0-9+\-.]*:{_HIER}(?:\?{_QUERY})?(?:#{_QUERY})?"

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "uuid": UUID,
    "uri": URI,
}
"""Format regexes over JSON string content (what the automaton reads)."""

DECODED_FORMATS: dict[str, str] = {**FORMATS, "email": _email('"', r"\\")}
"""The same over the decoded string (what a JSON-schema `pattern` applies to)."""
