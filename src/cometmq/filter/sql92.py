"""RocketMQ's SQL92 message-property filter: tokenizer, recursive-descent parser, closure compiler.

Grammar (RocketMQ's JMS-selector subset; keywords case-insensitive; ``--`` line and ``/* */`` comments)::

    expr       := or EOF
    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := relational ( ('=' | '<>') relational | IS [NOT] NULL )*
    relational := unary ( ('>' | '>=' | '<' | '<=') unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' STRING ( ',' STRING )* ')'
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) STRING )*
    unary      := ('+' | '-' | NOT) unary | primary
    primary    := STRING | INTEGER | DECIMAL | TRUE | FALSE | NULL | IDENTIFIER | '(' or ')'

As in RocketMQ, prefix NOT binds tighter than comparisons, so ``NOT a > 5`` is rejected (write
``NOT (a > 5)``). Evaluation uses three-valued logic (``None`` = unknown); a message matches only
when the whole expression is TRUE. Property values are strings, converted like RocketMQ does:
against an integer literal with ``Integer.valueOf`` rules when the literal fits an int and ``Long.valueOf`` ones
otherwise (any decimal digit of the BMP, fullwidth ones too; so '3000000000' does not convert against ``5``),
against a decimal with ``Double.valueOf`` rules (ASCII digits only, hexadecimal forms such as ``0x1p3`` too),
against TRUE/FALSE with ``Boolean.valueOf``; ``>``/``<`` between two strings parses both as doubles, and doubles
order as ``Double.compareTo`` does (NaN above every number and equal to itself, -0.0 below 0.0). Literal
strings, booleans and NULL are rejected by ``>``/``>=``/``<``/``<=``/BETWEEN at compile time, as in RocketMQ.

Where RocketMQ's evaluation throws, the message does not match, whatever the rest of the expression says (its
broker logs the error and skips the message): a property that does not convert (``a = 5 OR TRUE`` takes no
message whose ``a`` is 'x'), and a boolean on the left of ``=``/``<>`` with a string on the right (``TRUE = a``,
``(b > 1) <> a`` with ``a`` present: RocketMQ casts the string to a Boolean). As in RocketMQ, AND and OR
evaluate left to right and stop at the first operand that decides them, so ``TRUE OR a = 5`` matches whatever
``a`` is, and ``=`` evaluates both sides, ``>`` and the like stop at a NULL left side.

NULL (a missing property, or a value that is NULL: ``-a`` of a non-number, an unknown condition) follows
RocketMQ exactly, lopsided as it is:

* ``x = y`` is unknown when only ``x`` is NULL, FALSE when only ``y`` is, TRUE when both are; ``x <> y`` is
  NOT (x = y): unknown, TRUE, FALSE. So ``'v' <> a`` takes a message without ``a``, ``a <> 'v'`` does not;
  ``a = b`` takes a message with neither.
* ``>``, ``>=``, ``<``, ``<=``, BETWEEN, NOT BETWEEN, IN, NOT IN: unknown when a side is NULL.
* CONTAINS, STARTSWITH, ENDSWITH and their NOT forms: FALSE for NULL (so ``NOT (a CONTAINS 'v')`` is TRUE).
* IS NULL / IS NOT NULL: TRUE / FALSE for NULL; NOT of unknown is unknown; AND and OR are SQL's three-valued
  ones (FALSE AND unknown = FALSE, TRUE OR unknown = TRUE); a bare property as a condition is unknown when
  missing and FALSE otherwise.
The package docstring (cometmq.filter) lists the few deliberate differences from RocketMQ.
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Final, NamedTuple, cast

from cometmq.common.java_text import JAVA_TRIM
from cometmq.common.memo import cached_by_length

__all__ = [
    "MAX_DEPTH", "MAX_LENGTH", "MAX_NESTING", "FilterSyntaxError", "Predicate", "cached_filter", "compile_sql92",
]

Value = str | int | float | bool | None
Props = Mapping[str, str]
Evaluator = Callable[[Props], Value]
Predicate = Callable[[Props], bool]

MAX_NESTING: Final = 50  # parentheses and prefix operators inside one another
MAX_DEPTH: Final = 200  # depth of the compiled closure tree (bounds evaluation recursion)
MAX_LENGTH: Final = 65_536  # characters; bounds a compile's time (~50 ms) and memory (~2.5 MB)
_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1


class FilterSyntaxError(ValueError):
    """A malformed or ill-typed SQL92 expression; the broker answers SUBSCRIPTION_PARSE_FAILED."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.message = message
        self.position = position


# ---------------------------------------------------------------------------------------------- tokens

_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)
# Every token takes the whole run of digits (INTEGER: the parser refuses leading zeros), and a '--' past the
# last line break is two minus signs without trying the comment: a match attempt that scans a long run and then
# fails must not be repeated at each position of that run (a quadratic tokenizer stalls the event loop).
_TOKEN_PATTERN: Final = r"""
      (?P<SKIP>[ \t\n\r\f]+ {line_comment}| /\*.*?\*/)
    | (?P<DECIMAL>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)? | \.[0-9]+(?:[eE][+-]?[0-9]+)? | [0-9]+[eE][+-]?[0-9]+)
    | (?P<INTEGER>[0-9]+[lL]?)
    | (?P<ID>[A-Za-z_$][A-Za-z0-9_$.]*)
    | (?P<STRING>'[^']*(?:''[^']*)*')
    | (?P<OP><>|<=|>=|[=<>(),+-])
    """
_TOKEN_RE: Final = re.compile(_TOKEN_PATTERN.format(line_comment=r"| --[^\n\r]*(?:\r\n|\n|\r) "),
                              re.VERBOSE | re.DOTALL)
_TAIL_TOKEN_RE: Final = re.compile(_TOKEN_PATTERN.format(line_comment=""), re.VERBOSE | re.DOTALL)


class _Token(NamedTuple):
    kind: str  # ID, STRING, INTEGER, DECIMAL, EOF, a keyword in upper case, or the operator text
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, end = 0, len(text)
    last_break = max(text.rfind("\n"), text.rfind("\r"))  # a '--' comment needs one after it
    while pos < end:
        m = (_TOKEN_RE if pos < last_break else _TAIL_TOKEN_RE).match(text, pos)
        if m is None:
            if text[pos] == "'":
                raise FilterSyntaxError("unterminated string literal", pos)
            if text.startswith("/*", pos):
                raise FilterSyntaxError("unterminated comment", pos)
            raise FilterSyntaxError(f"unexpected character {text[pos]!r}", pos)
        kind, word = m.lastgroup or "", m.group()
        if kind == "ID" and word.upper() in _KEYWORDS:
            kind = word.upper()
        elif kind == "OP":
            kind = word
        if kind != "SKIP":
            tokens.append(_Token(kind, word, pos))
        pos = m.end()
    tokens.append(_Token("EOF", "", end))
    return tokens


# ---------------------------------------------------------------------------------------------- values

_LONG_RE: Final = re.compile(r"[+-]?[0-9]+")
_UNICODE_LONG_RE: Final = re.compile(r"[+-]?(?:(?![\U00010000-\U0010ffff])\d)+")  # \d: Unicode category Nd
_DOUBLE_RE: Final = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_HEX_DOUBLE_RE: Final = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?")


class _Unconvertible(Exception):
    """RocketMQ's evaluation throws (a value that does not convert): the message does not match, whatever the
    rest of the expression says (the broker logs the error and skips the message)."""


_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


def _int_typed(c: int) -> bool:
    """Whether an integer constant is an Integer to RocketMQ, not a Long: a literal that fits an int, or its
    negation (-2147483648 is the negation of a long)."""
    return -_INT_MAX <= c <= _INT_MAX


def _to_long(s: str) -> int | None:
    """``Long.valueOf`` on a property value; None when it would throw."""
    if s.isdigit() and s.isascii() and len(s) < 19:
        return int(s)
    if _LONG_RE.fullmatch(s) is None:
        if s.isascii() or _UNICODE_LONG_RE.fullmatch(s) is None:
            return None
        # Character.digit: any decimal digit of the BMP (fullwidth, Arabic-Indic...): read as its ASCII digit
        s = "".join(c if c in "+-" else chr(48 + unicodedata.decimal(c)) for c in s)
    digits = s.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:  # also keeps int() clear of its 4300-digit limit
        return None
    n = -int(digits) if s[0] == "-" else int(digits)
    return n if _LONG_MIN <= n <= _LONG_MAX else None


def _to_int(s: str) -> int | None:
    """``Integer.valueOf`` on a property value (RocketMQ's conversion against an integer literal that fits an
    int); None when it would throw."""
    if s.isdigit() and s.isascii() and len(s) < 10:
        return int(s)
    n = _to_long(s)
    return n if n is not None and _INT_MIN <= n <= _INT_MAX else None


def _to_double(s: str) -> float | None:
    """``Double.valueOf`` on a property value (decimal and hexadecimal forms, NaN, Infinity); None when it would
    throw."""
    if s.isdigit() and s.isascii():
        return float(s)
    t = s.strip(JAVA_TRIM)
    if _DOUBLE_RE.fullmatch(t) is not None:
        return float(t[:-1] if t[-1] in "fFdD" else t)
    if _HEX_DOUBLE_RE.fullmatch(t) is None:
        return None
    try:  # float.fromhex rounds as Double.valueOf does, and takes any exponent
        return float.fromhex(t[:-1] if t[-1] in "fFdD" else t)
    except OverflowError:
        return float("-inf") if t[0] == "-" else float("inf")


def _convert(s: str, like: Value) -> Value:
    """A string converted as RocketMQ does for a comparison with ``like``; raises _Unconvertible when it throws."""
    if isinstance(like, bool):
        return s.lower() == "true"
    n: int | float | None
    if isinstance(like, int):
        n = _to_int(s) if _int_typed(like) else _to_long(s)
    elif isinstance(like, float):
        n = _to_double(s)
    else:
        return s
    if n is None:
        raise _Unconvertible
    return n


def _java_order(x: float) -> tuple[int, float, float]:
    """A sort key in ``Double.compareTo``'s order: -0.0 below 0.0, NaN above everything and equal to itself."""
    return (1, 0.0, 0.0) if x != x else (0, x, math.copysign(1.0, x))


def _doubles(a: float, b: float) -> tuple[Any, Any]:
    """Two doubles as RocketMQ compares them (``Double.compareTo``)."""
    if a != a or b != b or a == b == 0:
        return _java_order(a), _java_order(b)
    return a, b


def _pair(lv: Value, rv: Value, relational: bool) -> tuple[Any, Any] | None:
    """Bring two runtime values to comparable form as RocketMQ does; None when one is NULL (unknown). Raises
    _Unconvertible where RocketMQ's evaluation throws."""
    if lv is None or rv is None:
        return None
    if type(lv) is type(rv):
        if relational and isinstance(lv, str) and isinstance(rv, str):
            a, b = _to_double(lv), _to_double(rv)  # ordering two strings: both as doubles
            if a is None or b is None:
                raise _Unconvertible
            if a != a or b != b or a == b == 0:  # _doubles, inlined
                return _java_order(a), _java_order(b)
            return a, b
        if type(lv) is float:
            return _doubles(lv, cast(float, rv))
        return lv, rv
    if isinstance(lv, str):
        lv = _convert(lv, rv)
    elif isinstance(rv, str):
        if isinstance(lv, bool):  # RocketMQ casts the string to a Boolean here, and that throws
            raise _Unconvertible
        rv = _convert(rv, lv)
    elif isinstance(lv, bool) or isinstance(rv, bool):
        return 0, 1  # Boolean vs Number: RocketMQ's comparator answers -1
    if isinstance(lv, float) or isinstance(rv, float):  # an Integer or Long meeting a Double becomes a Double
        assert isinstance(lv, int | float) and isinstance(rv, int | float)
        return _doubles(float(lv), float(rv))
    return lv, rv


_OPS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq, "<>": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}
_REL_OPS: Final = frozenset({">", ">=", "<", "<="})
_MIRROR: Final = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}
_STRING_OPS: Final[dict[str, Callable[[str, str], bool]]] = {
    "CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith,
}


# ---------------------------------------------------------------------------------------------- tree


class _Kind(Enum):
    PROP = "property"
    CONST = "literal"  # string or number literal
    BOOL = "boolean literal"  # TRUE, FALSE, NULL
    PRED = "boolean expression"
    VALUE = "negated value"


class _Expr:
    __slots__ = ("depth", "fn", "folded", "kind", "name", "pos", "value")

    def __init__(self, kind: _Kind, fn: Evaluator, pos: int, depth: int = 1, *, value: Value = None,
                 folded: bool = False, name: str = "") -> None:
        if depth > MAX_DEPTH:
            raise FilterSyntaxError("expression is too deeply nested", pos)
        self.kind, self.fn, self.pos, self.depth = kind, fn, pos, depth
        self.value, self.folded, self.name = value, folded, name


def _constant(kind: _Kind, value: Value, pos: int, depth: int = 1) -> _Expr:
    return _Expr(kind, lambda _p: value, pos, depth, value=value, folded=True)


def _prop(name: str, pos: int) -> _Expr:
    return _Expr(_Kind.PROP, lambda p: p.get(name), pos, name=name)


def _boolean(e: _Expr) -> _Expr:
    """RocketMQ's asBooleanExpression: a bare property casts to FALSE (present) or unknown (missing)."""
    if e.kind in (_Kind.PRED, _Kind.BOOL):
        return e
    if e.kind is _Kind.PROP:
        name = e.name
        return _Expr(_Kind.PRED, lambda p: None if p.get(name) is None else False, e.pos, e.depth + 1)
    raise FilterSyntaxError(f"expected a boolean expression, found a {e.kind.value}", e.pos)


def _logic(parts: list[_Expr], is_and: bool, pos: int) -> _Expr:
    fns = tuple(p.fn for p in parts)
    stop = not is_and  # AND stops at FALSE, OR at TRUE

    if len(fns) == 2:
        f, g = fns

        def two(p: Props) -> Value:
            a = f(p)
            if a is stop:
                return stop
            b = g(p)
            if b is stop:
                return stop
            return None if a is None or b is None else is_and

        fn: Evaluator = two
    else:

        def many(p: Props) -> Value:
            unknown = False
            for h in fns:
                r = h(p)
                if r is stop:
                    return stop
                if r is None:
                    unknown = True
            return None if unknown else is_and

        fn = many
    return _Expr(_Kind.PRED, fn, pos, max(p.depth for p in parts) + 1)


def _not(e: _Expr, pos: int) -> _Expr:
    f = e.fn
    return _Expr(_Kind.PRED, lambda p: None if (r := f(p)) is None else not r, pos, e.depth + 1)


def _negate(e: _Expr, pos: int) -> _Expr:
    """Unary minus: numbers negate, anything else yields NULL (never a constant to the type checks)."""
    if e.folded:
        return _constant(_Kind.VALUE, _minus(e.value), pos, e.depth + 1)
    f = e.fn
    return _Expr(_Kind.VALUE, lambda p: _minus(f(p)), pos, e.depth + 1)


def _minus(v: Value) -> Value:
    return -v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _check_operand(e: _Expr, op: str) -> None:
    if op in ("=", "<>"):
        if e.kind in (_Kind.CONST, _Kind.BOOL) and e.value is None:
            raise FilterSyntaxError(f"NULL cannot be compared with '{op}' (use IS NULL)", e.pos)
    elif e.kind is _Kind.CONST and not isinstance(e.value, int | float):
        raise FilterSyntaxError(f"a string literal cannot be compared with '{op}', only numbers can", e.pos)
    elif e.kind is _Kind.BOOL:
        raise FilterSyntaxError(f"a boolean literal or NULL cannot be compared with '{op}'", e.pos)
    elif e.kind is _Kind.PRED:
        raise FilterSyntaxError(f"a boolean expression cannot be compared with '{op}' (prefix NOT binds tighter "
                                "than comparisons: write NOT (...))", e.pos)


def _specialized(op: str, left: _Expr, right: _Expr, missing: Value, mirrored: bool) -> Evaluator | None:
    """Fast closures for ``property <op> constant`` (``constant <op'> property`` when mirrored); ``missing`` is the
    answer when the property is missing."""
    c = right.value
    if left.kind is not _Kind.PROP or not right.folded or c is None:
        return None
    name = left.name
    if isinstance(c, bool):
        if mirrored:  # TRUE = a: RocketMQ casts the property's string to a Boolean, which throws

            def cast_error(p: Props) -> Value:
                if p.get(name) is None:
                    return missing
                raise _Unconvertible

            return cast_error
        want = c if op == "=" else not c
        return lambda p: missing if (v := p.get(name)) is None else (v.lower() == "true") is want
    if isinstance(c, str):
        equal = op == "="  # only = and <> reach here: ordering a string literal is a compile error
        return lambda p: missing if (v := p.get(name)) is None else (v == c) is equal
    conv: Callable[[str], int | float | None]
    if isinstance(c, int):  # Integer.valueOf for a literal that fits an int, Long.valueOf for a bigger one
        conv = _to_int if _int_typed(c) else _to_long
    else:
        conv = _to_double
        if op in (">", ">="):  # Double.compareTo puts NaN above every number: NaN > c holds
            below = operator.le if op == ">" else operator.lt

            def above(p: Props) -> Value:
                v = p.get(name)
                if v is None:
                    return missing
                n = conv(v)
                if n is None:
                    raise _Unconvertible
                return not below(n, c)

            return above
    cmp = _OPS[op]

    def number(p: Props) -> Value:
        v = p.get(name)
        if v is None:
            return missing
        n = conv(v)
        if n is None:
            raise _Unconvertible
        return cmp(n, c)

    return number


def _compare(op: str, left: _Expr, right: _Expr, pos: int) -> _Expr:
    _check_operand(left, op)
    _check_operand(right, op)
    if op in ("=", "<>") and left.kind is _Kind.BOOL and right.kind is _Kind.CONST:
        raise FilterSyntaxError(f"a boolean literal cannot be compared with a {right.kind.value}", pos)
    # RocketMQ's = is lopsided about NULL: unknown when only the left side is NULL, FALSE when only the right one
    # is, TRUE when both are; <> is its negation. Ordering comparisons are unknown when either side is NULL.
    equal = op == "="
    right_null = None if op in _REL_OPS else not equal
    fn = _specialized(op, left, right, None, False) or _specialized(_MIRROR[op], right, left, right_null, True)
    if fn is not None:
        return _Expr(_Kind.PRED, fn, pos, max(left.depth, right.depth) + 1)
    if op in _REL_OPS:
        lf, rf, cmp = left.fn, right.fn, _OPS[op]

        def ordering(p: Props) -> Value:
            pair = _pair(lf(p), rf(p), True)
            return None if pair is None else cmp(pair[0], pair[1])

        fn = ordering
    else:
        lf, rf, cmp = left.fn, right.fn, _OPS[op]

        def equality(p: Props) -> Value:
            lv, rv = lf(p), rf(p)
            if lv is None:
                return equal if rv is None else None
            if rv is None:
                return right_null
            pair = _pair(lv, rv, False)
            return None if pair is None else cmp(pair[0], pair[1])

        fn = equality
    return _Expr(_Kind.PRED, fn, pos, max(left.depth, right.depth) + 1)


def _between(v: _Expr, low: _Expr, high: _Expr, negated: bool, pos: int) -> _Expr:
    if negated:
        return _logic([_compare("<", v, low, pos), _compare(">", v, high, pos)], False, pos)
    parts = [_compare(">=", v, low, pos), _compare("<=", v, high, pos)]
    if low.kind is _Kind.CONST and high.kind is _Kind.CONST and _OPS["<"](high.value, low.value):
        raise FilterSyntaxError(f"BETWEEN lower bound {low.value} is greater than upper bound {high.value}", pos)
    return _logic(parts, True, pos)


def _in(v: _Expr, values: list[str], negated: bool, pos: int) -> _Expr:
    if v.kind is not _Kind.PROP:
        raise FilterSyntaxError(f"IN needs a property on its left, found a {v.kind.value}", v.pos)
    name, members = v.name, frozenset(values)
    return _Expr(_Kind.PRED, lambda p: None if (x := p.get(name)) is None else (x in members) is not negated,
                 pos, v.depth + 1)


def _string_op(kind: str, v: _Expr, search: str, negated: bool, pos: int) -> _Expr:
    if not search:  # RocketMQ: an empty search string never matches, negated or not
        return _constant(_Kind.PRED, False, pos, v.depth + 1)
    f, test = v.fn, _STRING_OPS[kind]  # NULL and non-strings: FALSE, negated or not
    return _Expr(_Kind.PRED, lambda p: isinstance(x := f(p), str) and test(x, search) is not negated,
                 pos, v.depth + 1)


def _is_null(e: _Expr, negated: bool, pos: int) -> _Expr:
    f = e.fn
    return _Expr(_Kind.PRED, lambda p: (f(p) is None) is not negated, pos, e.depth + 1)


# ---------------------------------------------------------------------------------------------- parser

_NOT_FOLLOWERS: Final = frozenset({"BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH"})


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.i = 0
        self.nesting = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return tok

    def accept(self, kind: str) -> bool:
        if self.tok.kind == kind:
            self.advance()
            return True
        return False

    def expect(self, kind: str, what: str) -> _Token:
        if self.tok.kind != kind:
            raise self.error(what)
        return self.advance()

    def error(self, what: str) -> FilterSyntaxError:
        tok = self.tok
        found = "end of expression" if tok.kind == "EOF" else repr(tok.text)
        return FilterSyntaxError(f"expected {what}, found {found}", tok.pos)

    def enter(self, pos: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise FilterSyntaxError(f"more than {MAX_NESTING} nested parentheses or prefix operators", pos)

    def parse(self) -> _Expr:
        e = _boolean(self.or_())
        if self.tok.kind != "EOF":
            raise self.error("an operator, AND, OR or end of expression")
        return e

    def or_(self) -> _Expr:
        return self.logic(self.and_, "OR")

    def and_(self) -> _Expr:
        return self.logic(self.equality, "AND")

    def logic(self, operand: Callable[[], _Expr], keyword: str) -> _Expr:
        first = operand()
        if self.tok.kind != keyword:
            return first
        pos, parts = self.tok.pos, [_boolean(first)]
        while self.accept(keyword):
            parts.append(_boolean(operand()))
        return _logic(parts, keyword == "AND", pos)

    def equality(self) -> _Expr:
        left = self.relational()
        while True:
            tok = self.tok
            if tok.kind in ("=", "<>"):
                self.advance()
                left = _compare(tok.kind, left, self.relational(), tok.pos)
            elif tok.kind == "IS":
                self.advance()
                negated = self.accept("NOT")
                self.expect("NULL", "NULL" if negated else "NULL or NOT NULL")
                left = _is_null(left, negated, tok.pos)
            else:
                return left

    def relational(self) -> _Expr:
        left = self.unary()
        while True:
            tok = self.tok
            if tok.kind in _REL_OPS:
                self.advance()
                left = _compare(tok.kind, left, self.unary(), tok.pos)
                continue
            negated = tok.kind == "NOT" and self.tokens[self.i + 1].kind in _NOT_FOLLOWERS
            if negated:
                self.advance()
            elif tok.kind not in _NOT_FOLLOWERS:
                return left
            kind = self.advance().kind
            if kind == "BETWEEN":
                low = self.unary()
                self.expect("AND", "AND")
                left = _between(left, low, self.unary(), negated, tok.pos)
            elif kind == "IN":
                self.expect("(", "'(' after IN")
                values = [self.string()]
                while self.accept(","):
                    values.append(self.string())
                self.expect(")", "',' or ')'")
                left = _in(left, values, negated, tok.pos)
            else:
                left = _string_op(kind, left, self.string(), negated, tok.pos)

    def string(self) -> str:
        return self.expect("STRING", "a string literal").text[1:-1].replace("''", "'")

    def unary(self) -> _Expr:
        tok = self.tok
        if tok.kind not in ("+", "-", "NOT"):
            return self.primary()
        self.advance()
        self.enter(tok.pos)
        operand = self.unary()
        self.nesting -= 1
        if tok.kind == "+":
            return operand
        if tok.kind == "-":
            return _negate(operand, tok.pos)
        return _not(_boolean(operand), tok.pos)

    def primary(self) -> _Expr:
        tok = self.tok
        kind = tok.kind
        if kind == "ID":
            self.advance()
            return _prop(tok.text, tok.pos)
        if kind == "STRING":
            return _constant(_Kind.CONST, self.string(), tok.pos)
        if kind == "INTEGER":
            self.advance()
            digits = tok.text.rstrip("lL")
            if digits[0] == "0" and tok.text != "0":
                raise FilterSyntaxError(f"integer literal {tok.text[:40]} starts with 0", tok.pos)
            if len(digits) > 19 or int(digits) > _LONG_MAX:
                raise FilterSyntaxError(f"integer literal {tok.text[:40]} is out of the long range", tok.pos)
            return _constant(_Kind.CONST, int(digits), tok.pos)
        if kind == "DECIMAL":
            self.advance()
            value = float(tok.text)
            if value == float("inf"):
                raise FilterSyntaxError(f"decimal literal {tok.text[:40]} is out of the double range", tok.pos)
            return _constant(_Kind.CONST, value, tok.pos)
        if kind in ("TRUE", "FALSE", "NULL"):
            self.advance()
            return _constant(_Kind.BOOL, {"TRUE": True, "FALSE": False}.get(kind), tok.pos)
        if kind == "(":
            self.advance()
            self.enter(tok.pos)
            e = self.or_()
            self.nesting -= 1
            self.expect(")", "')'")
            return e
        raise self.error("a literal, a property name or '('")


# ---------------------------------------------------------------------------------------------- API


def compile_sql92(expr: str) -> Predicate:
    """Compile a RocketMQ SQL92 filter into ``matches(properties) -> bool``.

    Raises FilterSyntaxError (a ValueError) for any malformed or ill-typed expression.
    The returned callable never raises for a mapping of str to str.
    """
    if len(expr) > MAX_LENGTH:
        raise FilterSyntaxError(f"expression is longer than {MAX_LENGTH} characters", MAX_LENGTH)
    try:
        fn = _Parser(expr).parse().fn
    except RecursionError:  # only reachable when the caller's own stack is already deep
        raise FilterSyntaxError("expression is too deeply nested", 0) from None

    def matches(properties: Props) -> bool:
        try:
            return fn(properties) is True
        except _Unconvertible:  # RocketMQ's evaluation throws: the broker does not deliver the message
            return False

    return matches


#: compile_sql92 memoised per expression (a compiled filter of up to 1,024 characters takes at most ~40 KB; longer
#: ones have a cache of 16)
cached_filter: Final = cached_by_length(compile_sql92)
