"""Regexes for the string formats we enforce, spelled as JSON string content (quotes excluded).

date, time and date-time follow RFC 3339 (days per month and leap years exact; year 0000 left
out, as Python and most parsers reject it), narrowed to exclude leap seconds (:60), which common
validators reject. email follows RFC 5321 (dot-atom or quoted local part; host name or an address
literal); uri and uri-reference RFC 3986; hostname, duration, json-pointer, relative-json-pointer
and uri-template are narrowed to the simple forms their comments give. Every regex here describes
a subset of what the format allows: narrow, never widen.
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
_OFFSET = f"(?:[Zz]|[+-]{_HOUR}:{_MIN})"
TIME = f"{_HOUR}:{_MIN}:{_MIN}{_FRAC}{_OFFSET}"
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

# A relative reference: "//" authority, an absolute path, a path whose first segment has no ":", or nothing.
_SEGMENT_NC = f"(?:[{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT})+"
_RELATIVE = f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_SEGMENT_NC}(?:/{_PCHAR}*)*|)"
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE}(?:\?{_QUERY})?(?:#{_QUERY})?)"

# Host names (RFC 1123), narrowed to at most four labels of at most 62 characters: always within the
# 253-character limit, so the length needs no counting.
# (no hyphen among the first three characters, so no label is an "xn--" A-label, whose Punycode would need
# checking)
_HOST_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9](?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?)?)?"
HOSTNAME = rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,3}}"

# RFC 3339 durations (appendix A), with at most four digits per number.
_N = "[0-9]{1,4}"
_DUR_TIME = f"T(?:{_N}H(?:{_N}M(?:{_N}S)?)?|{_N}M(?:{_N}S)?|{_N}S)"
DURATION = f"P(?:(?:{_N}D|{_N}M(?:{_N}D)?|{_N}Y(?:{_N}M(?:{_N}D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|{_N}W)"

# JSON pointers narrowed to reference tokens of plain characters (and the ~0 / ~1 escapes).
JSON_POINTER = r"(?:/(?:[A-Za-z0-9_.$ -]|~[01])*)*"
RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]{{0,5}})(?:#|{JSON_POINTER})"

# URI templates (RFC 6570) narrowed to literals and simple {name} / {name,name} expressions.
URI_TEMPLATE = r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&()*+,;=]|%[0-9A-Fa-f]{2}|\{[A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*\})*"

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "uuid": UUID,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "duration": DURATION,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "uri-template": URI_TEMPLATE,
}
"""Format regexes over JSON string content (what the automaton reads)."""

DECODED_FORMATS: dict[str, str] = {**FORMATS, "email": _email('"', r"\\")}
"""The same over the decoded string (what a JSON-schema `pattern` applies to)."""

_NO_LEAP_SECOND = "leap seconds (second 60) are not generated"
NARROWED: dict[str, str] = {
    "date": "year 0000 is not generated",
    "time": _NO_LEAP_SECOND,
    "date-time": f"{_NO_LEAP_SECOND}, nor year 0000",
    "hostname": "at most four labels, none starting with an A-label's 'xn--' (no hyphen among its first three "
    "characters)",
    "duration": "at most four digits per number",
    "json-pointer": "reference tokens of plain ASCII characters",
    "relative-json-pointer": "reference tokens of plain ASCII characters, a prefix of at most six digits",
    "uri-template": "literals and simple {name} expressions",
}
"""How each format regex above is narrower than the format (reported with every schema that uses one)."""
