"""JSON schema -> one regex for its compact JSON text (no whitespace anywhere).

Objects list their declared properties in schema order (required ones always, optional ones
maybe), then any additional properties (keys other than the declared names). Values without
constraints ("any JSON") nest at most `any_depth` levels; recursive `$ref`s unroll at most
`max_ref_depth` times. Both bounds only narrow what is generated.

A regex longer than `max_chars` is of no use (the token automaton is built only from short ones), and
objects with many optional properties grow their regex quadratically: every sub-regex is checked
against the limit as soon as it is built, so a schema that cannot have one stops early (`NotRegular`)
instead of building hundreds of megabytes of text first.
"""

from __future__ import annotations

from typing import Any

from loraplex.grammar.grounding import GroundedSlot, placeholder
from loraplex.grammar.schema import json_text as jt
from loraplex.grammar.schema.ecma_pattern import pattern_to_content_regex
from loraplex.grammar.schema.formats import FORMATS
from loraplex.grammar.schema.normalize import Ctx, Node, Normalizer, NotRegular, Sub
from loraplex.grammar.schema.numeric import decimal_range, integer_bounds, integer_range
from loraplex.grammar.spec import GrammarError

MAX_REGEX_CHARS = 4_000_000


def _number_literal(v: int | float) -> str:
    """The canonical spelling of a number: integral values without a fraction (as llguidance)."""
    if isinstance(v, float) and not v.is_integer():
        return jt.rx_escape(repr(v))
    return jt.rx_escape(str(int(v)))


def const_regex(v: Any) -> str:
    """Regex for the JSON value `v` (canonical number spelling, objects in the given key order)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _number_literal(v)
    if isinstance(v, str):
        return jt.string_literal(v)
    if isinstance(v, list):
        return r"\[" + ",".join(const_regex(x) for x in v) + r"\]"
    return r"\{" + ",".join(jt.string_literal(k) + ":" + const_regex(x) for k, x in v.items()) + r"\}"


class SchemaRegex:
    """Builds the regex of one schema; `build()` raises GrammarError or NotRegular."""

    def __init__(
        self, root: Any, *, max_ref_depth: int = 3, any_depth: int = 2, max_chars: int = MAX_REGEX_CHARS
    ) -> None:
        self.norm = Normalizer(root, max_ref_depth)
        self.max_chars = max_chars
        self.root = root  # the schema whose regex build() returns
        self.any_depth = any_depth
        self._memo: dict[Any, str | None] = {}
        self._any: dict[int, str] = {}
        # grounded strings (x-loraplex-grounded): the regex holds grounding.placeholder(k) for slot k's content
        self.grounded: list[GroundedSlot] = []
        self._slots: dict[tuple[str, tuple[str, ...]], int] = {}

    @property
    def narrowing(self) -> list[str]:
        """What the regex leaves out that the schema allows: recursion and free-form nesting cut at their bounds."""
        return sorted(self.norm.cuts)

    def build(self) -> str:
        rx = self.value([(self.root, "")], Ctx())
        if rx is None:
            raise GrammarError("schema is unsatisfiable: no JSON value can match it", code="unsatisfiable_schema")
        return rx

    def _bounded(self, rx: str | None) -> str | None:
        if rx is not None and len(rx) > self.max_chars:
            raise NotRegular(f"regex of more than {self.max_chars} characters is too large")
        return rx

    # ---- values --------------------------------------------------------------------------------
    def value(self, subs: list[Sub], ctx: Ctx) -> str | None:
        key = (tuple(ptr for _, ptr in subs), ctx.refs)
        if key not in self._memo:
            self._memo[key] = self._bounded(self._value(subs, ctx))
        return self._memo[key]

    def _value(self, subs: list[Sub], ctx: Ctx) -> str | None:
        parts, total = [], 0
        for term in self.norm.dnf(subs, ctx):
            if not term.parts:
                where = subs[-1][1] if subs else ""
                self.norm.cuts.add(
                    f"{{}} at {where or '/'}: any JSON value, containers nested at most {self.any_depth} deep"
                )
                return self.any_value(self.any_depth)
            for node in self.norm.nodes(term):
                rx = self._bounded(self.emit(node))
                if rx is not None:
                    parts.append(rx)
                    total += len(rx)
                    if total > self.max_chars:
                        raise NotRegular(f"regex of more than {self.max_chars} characters is too large")
        return jt.alt(parts) if parts else None

    def any_value(self, depth: int) -> str:
        """Any JSON value with at most `depth` levels of nested containers below this one."""
        if depth not in self._any:
            scalars = [jt.NULL, jt.BOOLEAN, jt.NUMBER, jt.STRING]
            if depth <= 0:
                self._any[depth] = jt.alt(scalars + [r"\[\]", r"\{\}"])
            else:
                inner = self.any_value(depth - 1)
                pair = f"{jt.STRING}:{inner}"
                arr = rf"\[(?:{inner}(?:,{inner})*)?\]"
                obj = rf"\{{(?:{pair}(?:,{pair})*)?\}}"
                self._any[depth] = jt.alt(scalars + [arr, obj])
        return self._any[depth]

    def emit(self, node: Node) -> str | None:
        kind = node.kind
        if kind == "null":
            return jt.NULL
        if kind == "boolean":
            return jt.BOOLEAN
        if kind == "const":
            if node.grounded and any(isinstance(v, str) for v in node.values):
                strings = [v for v in node.values if isinstance(v, str)]
                content = jt.alt([jt.string_literal(v)[1:-1] for v in strings])
                rest = [const_regex(v) for v in node.values if not isinstance(v, str)]
                return jt.alt([f'"{self._slot(node, (content,))}"', *rest])
            return jt.alt([const_regex(v) for v in node.values])
        if kind == "number":
            return self._number(node)
        if kind == "string":
            return self._string(node)
        if kind == "array":
            return self._array(node)
        return self._object(node)

    # ---- scalars -------------------------------------------------------------------------------
    @staticmethod
    def _number(node: Node) -> str | None:
        bounded = node.lo is not None or node.hi is not None
        if node.integer_only:
            if not bounded:
                return jt.INTEGER
            lo, hi = integer_bounds(
                node.lo if not node.lo_strict else None,
                node.hi if not node.hi_strict else None,
                node.lo if node.lo_strict else None,
                node.hi if node.hi_strict else None,
            )
            return integer_range(lo, hi)
        if not bounded:
            return jt.NUMBER
        return decimal_range(node.lo, node.lo_strict, node.hi, node.hi_strict, node.fraction_digits)

    def _slot(self, node: Node, content: tuple[str, ...]) -> str:
        """The placeholder of a grounded string's content (one slot per place and content regexes)."""
        ptr = node.term.parts[-1][1] if node.term.parts else ""
        key = (ptr, content)
        if key not in self._slots:
            self._slots[key] = len(self.grounded)
            self.grounded.append(GroundedSlot(ptr or "/", content))
        return placeholder(self._slots[key])

    def _string(self, node: Node) -> str | None:
        if node.max_len is not None and node.min_len > node.max_len:
            return None
        lengths = node.min_len > 0 or node.max_len is not None
        if not node.grounded:  # one regex holds one keyword (a grounded string's span terminal intersects them all)
            ptr = node.term.parts[-1][1] if node.term.parts else ""
            if len(node.formats) > 1 or (node.formats and (node.patterns or lengths)):
                raise NotRegular(f"string at {ptr or '/'} combines format with other string constraints")
            if len(node.patterns) > 1 or (node.patterns and lengths):
                raise NotRegular(f"string at {ptr or '/'} combines pattern with other string constraints")
        content = [FORMATS[f] for f in node.formats]
        content += [pattern_to_content_regex(p, agreeing=True) for p in node.patterns]  # (the value must match it)
        if lengths:
            hi = "" if node.max_len is None else str(node.max_len)
            content.append(f"{jt.UNIT}{{{node.min_len},{hi}}}")
        if node.grounded:
            return f'"{self._slot(node, tuple(content))}"'
        return f'"{content[0] if content else jt.UNIT + "*"}"'

    # ---- containers ----------------------------------------------------------------------------
    def _array(self, node: Node) -> str | None:
        ctx = node.term.ctx
        items: list[str] = []
        for subs in node.positions:
            rx = self.value(subs, ctx)
            if rx is None:
                break
            items.append(rx)
        rest = None
        if len(items) == len(node.positions):
            rest = self.value(node.rest, ctx)
        limit = node.max_items
        if rest is None:
            limit = len(items) if limit is None else min(limit, len(items))
        lo = node.min_items
        if limit is not None and lo > limit:
            return None
        if limit == 0:
            return r"\[\]"
        fixed = items if limit is None else items[:limit]
        nf = len(fixed)
        if nf == 0:  # every item comes from `items`
            top = "" if limit is None else str(limit - 1)
            body = f"{rest}(?:,{rest}){{{max(lo - 1, 0)},{top}}}"
        else:
            tail = ""
            if rest is not None and (limit is None or limit > nf):
                top = "" if limit is None else str(limit - nf)
                tail = f"(?:,{rest}){{{max(lo - nf, 0)},{top}}}"
            for i in range(nf - 1, 0, -1):  # position i is written only if i < lo or chosen
                piece = f",{fixed[i]}{tail}"
                tail = piece if i < lo else f"(?:{piece})?"
            body = fixed[0] + tail
        return rf"\[{body}\]" if lo > 0 else rf"\[(?:{body})?\]"

    def _object(self, node: Node) -> str | None:
        ctx = node.term.ctx
        pairs: list[tuple[str, bool]] = []
        for name, subs, required in node.keys:
            rx = self.value(subs, ctx)
            if rx is None:
                if required:
                    return None
                continue
            pairs.append((f"{jt.string_literal(name)}:{rx}", required))
        extra_val = self.value(node.extra, ctx)
        extra = None
        if extra_val is not None:
            extra = f'"{jt.content_not_in([name for name, _, _ in node.keys])}":{extra_val}'
        # after[i]: the rest from pair i when something was written already (pieces start with ',')
        # first[i]: the rest from pair i when nothing was written yet
        after = f"(?:,{extra})*" if extra else ""
        first = f"(?:{extra}(?:,{extra})*)?" if extra else ""
        for pair, required in reversed(pairs):
            if required:
                first = f"{pair}{after}"
                after = f",{pair}{after}"
            else:
                first = f"(?:{pair}{after}|{first})" if first else f"(?:{pair}{after})?"
                after = f"(?:,{pair})?{after}"
            self._bounded(first)
        return rf"\{{{first}\}}"
