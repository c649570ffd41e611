"""Look-arounds in ECMA patterns, made regular: an ordinary regex for the whole strings that contain a match.

A look-around tests the rest of the string (ahead) or what came before (behind) without consuming it, so a
pattern with look-arounds still describes a regular set of strings, but one that needs intersection and
complement to write down. Neither grammar backend takes those in a JSON schema's pattern, so the set is
rewritten here into an ordinary regex (ecma_pattern's AST, without look-arounds), exactly: nothing narrowed.

**Continuation passing.** ``resolve(node, rest)`` is the language of strings ``u v`` where ``node`` matches
``u`` and ``v`` is in ``rest`` (the language of whatever follows, up to the end of the string). A look-ahead
``(?=X)`` is then ``rest ∩ K`` and ``(?!X)`` is ``rest`` minus ``K``, with ``K = resolve(X, Σ*)``; ``$`` is
the empty string when ``rest`` holds it (else nothing). A search pattern's whole-string language is
``resolve(Σ* P Σ*, ε)`` (no leading ``Σ*`` after a leading ``^``).

**Intersection by derivatives.** ``rest ∩ K`` (or minus) is built one character class at a time: the classes
that can start ``rest`` are split at every boundary of the classes that can start either language; for each
piece ``c`` the result continues with the derivatives ``(d_c rest, d_c K)`` (Brzozowski), pieces with the
same continuation merged back into one class. It ends when ``K`` has become empty or ``Σ*`` (the test is
decided) or ``rest`` is empty. That is a finite tree when the look-around's body has bounded length (a set
of words, ``.{1,63}$``, a class). A body that repeats without bound (``(?=.*\\d)``) revisits pairs of
derivatives: then the pairs are the states of an automaton, solved into a regex by state elimination
(Arden's rule), within a bound on states and size. ``(?!.*C)`` for a class ``C``, when everything ``rest``
can produce is in ``.`` or ``C``, means "no ``C`` at all": ``C`` is simply taken out of every class of
``rest``.

**Look-behinds** are look-aheads of the reversed pattern: a pattern with look-behinds only is reversed,
resolved, and its result reversed back. A look-behind right before a trailing ``$`` tests the whole string,
so it is applied last, the same way, to the result of the rest; look-aheads and other look-behinds in the
same alternative are refused, as are look-arounds, ``^`` and ``$`` inside a quantified group and Unicode
property classes (``\\p{..}``) in such a pattern. Results beyond a size bound are refused, never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeAlias

from loraplex.grammar.schema.ecma_ast import CharSet, Node, class_ranges, top_alternatives
from loraplex.grammar.spec import GrammarError

MAX_STEPS = 1500  # derivative pairs expanded per pattern (each costs a derivative of both operands)
MAX_NODES = 20000  # size of the resulting AST
MAX_OPERAND_NODES = 3000  # size of what one look-around is intersected with

Ivs: TypeAlias = tuple[tuple[int, int], ...]  # sorted disjoint closed intervals of code points

_TOP = 0x10FFFF
_ANY = ((0, 0xD7FF), (0xE000, _TOP))  # every Unicode scalar value (JSON text cannot carry lone surrogates)
_NONE: Node = ("none",)
_EPS: Node = ("seq", ())
_STAR: Node = ("rep", ("cls", _ANY), 0, None)


class _Fail(Exception):
    pass


class _Cycle(Exception):
    """The derivatives came back to a pair still being expanded: the result needs a loop."""


def has_lookaround(node: Node) -> bool:
    return _has(node, lambda n: n[0] == "look")


def whole_string_node(tree: Node, pattern: str) -> Node:
    """The search pattern `tree` (which has look-arounds) as an ecma_pattern AST without look-arounds that
    matches exactly the whole strings containing a match; GrammarError names what cannot be enforced."""
    solver = _Solver()
    try:
        out = _NONE
        for alt in top_alternatives(tree):
            items = list(alt[1]) if alt[0] == "seq" else [alt]
            out = _alt([out, solver.alternative([_internal(n) for n in items])])
    except _Fail as exc:
        raise GrammarError(f"pattern {pattern!r}: {exc}") from None
    if out == _NONE:
        raise GrammarError(f"pattern {pattern!r}: its look-arounds leave no string that matches")
    if _size(out) > MAX_NODES:
        raise GrammarError(f"pattern {pattern!r}: its look-arounds make the expression too large to enforce")
    return _to_ecma(out)


# ---- internal form: ("cls", intervals) ("seq", items) ("alt", items) ("rep", n, lo, hi) ("none",)
# ("bol",) ("eol",) ("look", ahead, negated, n); tuples all the way, so nodes are hashable keys.


def _internal(node: Node) -> Node:
    kind = node[0]
    if kind == "lit":
        return ("cls", ((ord(node[1]), ord(node[1])),))
    if kind == "set":
        return ("cls", _charset_intervals(node[1]))
    if kind == "seq":
        return _seq([_internal(n) for n in node[1]])
    if kind == "alt":
        return _alt([_internal(n) for n in node[1]])
    if kind == "rep":
        return _rep(_internal(node[1]), node[2], node[3])
    if kind == "look":
        return ("look", node[1], node[2], _internal(node[3]))
    return node  # bol, eol


def _charset_intervals(cs: CharSet) -> Ivs:
    if cs.props:
        raise _Fail("Unicode property classes in a pattern with look-arounds cannot be enforced")
    parts = [(ord(lo), ord(hi)) for lo, hi in cs.ranges]
    for name in cs.classes:
        inner = _merge([(ord(lo), ord(hi)) for lo, hi in class_ranges(name.lower())])
        parts += inner if name.islower() else _complement(inner)
    merged = _merge(parts)
    return _complement(merged) if cs.negated else _intersect(merged, _ANY)


def _merge(parts: Iterable[tuple[int, int]]) -> Ivs:
    out: list[list[int]] = []
    for lo, hi in sorted(parts):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ivs: Ivs) -> Ivs:
    out: list[tuple[int, int]] = []
    at = 0
    for lo, hi in ivs:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= _TOP:
        out.append((at, _TOP))
    return _intersect(tuple(out), _ANY)


def _intersect(a: Ivs, b: Ivs) -> Ivs:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _contains(ivs: Ivs, c: int) -> bool:
    return any(lo <= c <= hi for lo, hi in ivs)


def _seq(items: Iterable[Node]) -> Node:
    flat: list[Node] = []
    for n in items:
        if n == _NONE:
            return _NONE
        if n[0] == "seq":
            flat += n[1]
        else:
            flat.append(n)
    return flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def _alt(items: Iterable[Node]) -> Node:
    seen: dict[Node, None] = {}
    for n in items:
        for m in n[1] if n[0] == "alt" else (n,):
            if m != _NONE:
                seen[m] = None
    flat = list(seen)
    if not flat:
        return _NONE
    return flat[0] if len(flat) == 1 else ("alt", tuple(flat))


def _rep(n: Node, lo: int, hi: int | None) -> Node:
    if hi == 0 or n == _EPS:
        return _EPS
    if n == _NONE:
        return _EPS if lo == 0 else _NONE
    if (lo, hi) == (1, 1):
        return n
    return ("rep", n, lo, hi)


def _nullable(n: Node) -> bool:
    kind = n[0]
    if kind == "seq":
        return all(_nullable(m) for m in n[1])
    if kind == "alt":
        return any(_nullable(m) for m in n[1])
    if kind == "rep":
        return n[2] == 0 or _nullable(n[1])
    return False  # cls, none


def _deriv(n: Node, c: int) -> Node:
    kind = n[0]
    if kind == "cls":
        return _EPS if _contains(n[1], c) else _NONE
    if kind == "seq":
        if not n[1]:
            return _NONE
        head, rest = n[1][0], _seq(n[1][1:])
        out = _seq([_deriv(head, c), rest])
        return _alt([out, _deriv(rest, c)]) if _nullable(head) else out
    if kind == "alt":
        return _alt([_deriv(m, c) for m in n[1]])
    if kind == "rep":
        _, inner, lo, hi = n
        return _seq([_deriv(inner, c), _rep(inner, max(lo - 1, 0), None if hi is None else hi - 1)])
    return _NONE


def _firsts(n: Node, out: list[Ivs]) -> None:
    """The classes that can match a first character of `n`."""
    kind = n[0]
    if kind == "cls":
        out.append(n[1])
    elif kind == "seq":
        for m in n[1]:
            _firsts(m, out)
            if not _nullable(m):
                break
    elif kind == "alt":
        for m in n[1]:
            _firsts(m, out)
    elif kind == "rep":
        _firsts(n[1], out)


def _pieces(rest: Node, test: Node) -> list[tuple[tuple[int, int], ...]]:
    """The classes that can start `rest`, split so that each piece lies inside or outside every class that
    can start `rest` or `test` (every character of a piece has the same derivatives)."""
    starts: list[Ivs] = []
    _firsts(rest, starts)
    reach = _merge([iv for ivs in starts for iv in ivs])
    _firsts(test, starts)
    cuts = {lo for ivs in starts for lo, _ in ivs} | {hi + 1 for ivs in starts for _, hi in ivs}
    pieces: list[Ivs] = []
    for lo, hi in reach:
        inner = sorted(x for x in cuts if lo < x <= hi)
        bounds = [lo, *inner, hi + 1]
        pieces += [((a, b - 1),) for a, b in zip(bounds, bounds[1:])]
    return pieces


class _Solver:
    def __init__(self) -> None:
        self.memo: dict[tuple[Node, Node, bool], Node] = {}
        self.busy: set[tuple[Node, Node, bool]] = set()
        self.steps = 0  # derivative pairs expanded, over the whole pattern

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Fail("its look-arounds need too many states to enforce")

    def alternative(self, items: list[Node]) -> Node:
        """Whole strings containing a match of one top-level alternative."""
        suffix_tests = []
        while len(items) >= 2 and items[-1][0] == "eol" and items[-2][0] == "look" and not items[-2][1]:
            _, _, negated, body = items.pop(-2)
            suffix_tests.append((negated, body))
        aheads = any(_has(n, lambda m: m[0] == "look" and m[1]) for n in items)
        behinds = any(_has(n, lambda m: m[0] == "look" and not m[1]) for n in items)
        if aheads and behinds:
            raise _Fail("look-aheads and look-behinds in the same alternative cannot be enforced")
        out = self._reversed(items) if behinds else self._forward(items)
        for negated, body in suffix_tests:  # the whole string ends with a match of body (or does not)
            test = self.resolve(_reverse(body), _STAR)
            out = _reverse(self.intersect(_reverse(out), test, negated))
        return out

    def _forward(self, items: list[Node]) -> Node:
        anchored = bool(items) and items[0][0] == "bol"
        body = items[1:] if anchored else [_STAR, *items]
        if any(_has(n, lambda m: m[0] == "bol") for n in body):
            raise _Fail("'^' inside the pattern (not at its start) cannot be enforced")
        return self.resolve(_seq([*body, _STAR]), _EPS)

    def _reversed(self, items: list[Node]) -> Node:
        back = [_reverse(n) for n in reversed(items)]
        return _reverse(self._forward(back))

    def resolve(self, node: Node, rest: Node) -> Node:
        """Strings u v: `node` matches u (its look-aheads seeing u v), v in `rest`."""
        kind = node[0]
        if kind == "look":
            if not node[1]:
                raise _Fail("a look-behind inside a look-ahead cannot be enforced")
            return self.intersect(rest, self.resolve(node[3], _STAR), node[2])
        if kind == "eol":
            return _EPS if _nullable(rest) else _NONE
        if kind == "bol":
            raise _Fail("'^' inside the pattern (not at its start) cannot be enforced")
        if kind == "seq":
            for item in reversed(node[1]):
                rest = self.resolve(item, rest)
            return rest
        if kind == "alt":
            return _alt([self.resolve(m, rest) for m in node[1]])
        if kind == "rep" and _has(node[1], lambda m: m[0] in ("look", "bol", "eol")):
            raise _Fail("a look-around or anchor inside a quantified group cannot be enforced")
        return _seq([node, rest])

    def intersect(self, rest: Node, test: Node, negated: bool) -> Node:
        """`rest` ∩ `test`, or `rest` minus `test` when `negated`."""
        if _size(rest) + _size(test) > MAX_OPERAND_NODES:
            raise _Fail("its look-arounds make the expression too large to enforce")
        if negated:
            lifted = _no_class_anywhere(rest, test)
            if lifted is not None:
                return lifted
        try:
            return self._intersect(rest, test, negated)
        except _Cycle:
            self.busy.clear()
            return self._automaton(rest, test, negated)
        except RecursionError:
            raise _Fail("its look-arounds nest too deeply to enforce") from None

    @staticmethod
    def _decided(rest: Node, test: Node, negated: bool) -> Node | None:
        """The result when the test no longer depends on what follows, else None."""
        if rest == _NONE:
            return _NONE
        if test == _NONE:
            return rest if negated else _NONE
        if test == _STAR or (test[0] == "alt" and _STAR in test[1]):
            return _NONE if negated else rest
        return None

    def _intersect(self, rest: Node, test: Node, negated: bool) -> Node:
        decided = self._decided(rest, test, negated)
        if decided is not None:
            return decided
        key = (rest, test, negated)
        if key in self.memo:
            return self.memo[key]
        if key in self.busy:
            raise _Cycle
        self.step()
        self.busy.add(key)
        groups: dict[Node, list[tuple[int, int]]] = {}
        for piece in _pieces(rest, test):
            c = piece[0][0]
            sub = self._intersect(_deriv(rest, c), _deriv(test, c), negated)
            if sub != _NONE:
                groups.setdefault(sub, []).extend(piece)
        branches = [_EPS] if _nullable(rest) and _nullable(test) != negated else []
        branches += [_seq([("cls", _merge(ivs)), sub]) for sub, ivs in groups.items()]
        self.busy.discard(key)
        out = self.memo[key] = _alt(branches)
        return out

    def _automaton(self, rest: Node, test: Node, negated: bool) -> Node:
        """The intersection when its derivatives loop (the test's body repeats, as in ``(?=.*\\d)``): every
        pair of derivatives reachable from (rest, test) is a state of an automaton, each state's language
        an equation ``X = ε? | c1 X1 | c2 X2 ...``; the states are eliminated one by one (Arden's rule turns a
        self-loop ``X = A X | B`` into ``X = A* B``) until the start state's language is a regex."""
        start = (rest, test)
        eqs: dict[tuple[Node, Node], dict[tuple[Node, Node] | None, Node]] = {}
        order: list[tuple[Node, Node]] = []
        stack = [start]
        while stack:
            key = stack.pop()
            if key in eqs:
                continue
            self.step()
            r, t = key
            decided = self._decided(r, t, negated)
            eq: dict[tuple[Node, Node] | None, Node] = {}
            if decided is not None:
                eq[None] = decided
            else:
                if _nullable(r) and _nullable(t) != negated:
                    eq[None] = _EPS
                groups: dict[tuple[Node, Node], list[tuple[int, int]]] = {}
                for piece in _pieces(r, t):
                    c = piece[0][0]
                    nxt = (_deriv(r, c), _deriv(t, c))
                    if nxt[0] != _NONE:
                        groups.setdefault(nxt, []).extend(piece)
                for nxt, ivs in groups.items():
                    eq[nxt] = ("cls", _merge(ivs))
                    stack.append(nxt)
            eqs[key] = eq
            order.append(key)
        for key in reversed(order[1:]):  # the last found first: they sit deepest
            eq = _arden(eqs.pop(key), key)
            for other in eqs.values():
                coef = other.pop(key, None)
                if coef is None:
                    continue
                for target, value in eq.items():
                    term = _seq([coef, value])
                    other[target] = _alt([other[target], term]) if target in other else term
            if sum(_size(v) for e in eqs.values() for v in e.values()) > MAX_NODES:
                raise _Fail("its look-arounds make the expression too large to enforce")
        return _arden(eqs[start], start).get(None, _NONE)


def _arden(eq: dict[tuple[Node, Node] | None, Node], key: tuple[Node, Node]) -> dict[tuple[Node, Node] | None, Node]:
    """X = A X | B  ->  X = A* B (the equation of state `key` without its self-loop)."""
    loop = eq.pop(key, None)
    if loop is None:
        return eq
    star = _rep(loop, 0, None)
    return {target: _seq([star, value]) for target, value in eq.items()}


def _no_class_anywhere(rest: Node, test: Node) -> Node | None:
    """`rest` minus `test` when `test` is ``S* C Σ*`` (``(?!S*C)``, C and S classes) and every class of
    `rest` lies within S or C: a string of `rest` avoids the test exactly when it holds no C at all."""
    if test[0] != "seq" or len(test[1]) != 3 or test[1][2] != _STAR:
        return None
    loop, cls = test[1][0], test[1][1]
    if loop[0] != "rep" or loop[1][0] != "cls" or loop[2:] != (0, None) or cls[0] != "cls":
        return None
    allowed = _merge(loop[1][1] + cls[1])
    classes: list[Ivs] = []
    _classes(rest, classes)
    if any(_intersect(ivs, allowed) != ivs for ivs in classes):
        return None
    keep = _complement(cls[1])
    return _map_classes(rest, lambda ivs: _intersect(ivs, keep))


def _classes(n: Node, out: list[Ivs]) -> None:
    if n[0] == "cls":
        out.append(n[1])
    elif n[0] in ("seq", "alt"):
        for m in n[1]:
            _classes(m, out)
    elif n[0] == "rep":
        _classes(n[1], out)


def _map_classes(n: Node, fn: Callable[[Ivs], Ivs]) -> Node:
    kind = n[0]
    if kind == "cls":
        ivs = fn(n[1])
        return ("cls", ivs) if ivs else _NONE
    if kind == "seq":
        return _seq([_map_classes(m, fn) for m in n[1]])
    if kind == "alt":
        return _alt([_map_classes(m, fn) for m in n[1]])
    if kind == "rep":
        return _rep(_map_classes(n[1], fn), n[2], n[3])
    return n


def _has(n: Node, pred: Callable[[Node], bool]) -> bool:
    if pred(n):
        return True
    kind = n[0]
    if kind in ("seq", "alt"):
        return any(_has(m, pred) for m in n[1])
    if kind == "rep":
        return _has(n[1], pred)
    if kind == "look":
        return _has(n[3], pred)
    return False


def _reverse(n: Node) -> Node:
    """Matches the reversed strings: sequences backwards, look-behinds become look-aheads, ^ and $ swap."""
    kind = n[0]
    if kind == "seq":
        return ("seq", tuple(_reverse(m) for m in reversed(n[1])))
    if kind == "alt":
        return ("alt", tuple(_reverse(m) for m in n[1]))
    if kind == "rep":
        return ("rep", _reverse(n[1]), n[2], n[3])
    if kind == "look":
        return ("look", not n[1], n[2], _reverse(n[3]))
    if kind == "bol":
        return ("eol",)
    if kind == "eol":
        return ("bol",)
    return n


def _size(n: Node) -> int:
    if n[0] in ("seq", "alt"):
        return 1 + sum(_size(m) for m in n[1])
    if n[0] == "rep":
        return 1 + _size(n[1])
    return 1


def _to_ecma(n: Node) -> Node:
    kind = n[0]
    if kind == "cls":
        ivs = n[1]
        rest = _complement(ivs)
        if len(rest) < len(ivs):  # shorter written as a negated class
            return ("set", CharSet(ranges=[(chr(lo), chr(hi)) for lo, hi in rest], negated=True))
        return ("set", CharSet(ranges=[(chr(lo), chr(hi)) for lo, hi in ivs]))
    if kind == "seq":
        return ("seq", [_to_ecma(m) for m in n[1]])
    if kind == "alt":
        return ("alt", [_to_ecma(m) for m in n[1]])
    if kind == "rep":
        return ("rep", _to_ecma(n[1]), n[2], n[3])
    raise AssertionError(f"unexpected {kind!r} after resolving look-arounds")
