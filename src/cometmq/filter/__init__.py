"""Message filtering: RocketMQ's SQL92 property filter.

Deliberate differences from RocketMQ's evaluator (everything else mirrors it); none changes which messages an
expression RocketMQ accepts delivers:

* The literal ``0.0`` (and a decimal literal that rounds to it) is accepted: RocketMQ refuses decimals below
  ``Double.MIN_VALUE``, the smallest positive double.
* Identifiers may contain ``.`` after the first character; ``--`` comments may end the expression.
* An expression longer than MAX_LENGTH (65,536 characters) is refused, so a compile's time and memory stay
  bounded.
* A message skipped because its evaluation fails (a property that does not convert, see cometmq.filter.sql92) is
  not logged: RocketMQ logs each one as an error.

Missing properties (NULL), conversions (int or long range, doubles, hexadecimal floats, NaN) and evaluation
errors are not among the differences: they follow RocketMQ's rules exactly, including its lopsided ``=``/``<>``
(``'x' <> a`` is TRUE without ``a``, ``a <> 'x'`` unknown) and its rejecting a message whose property does not
convert whatever the rest of the expression says; cometmq.filter.sql92 lists them. Checked against RocketMQ's
own filter classes (rocketmq-filter 5.3.3+) on random expressions and property sets.
"""

from __future__ import annotations

from cometmq.filter.sql92 import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_NESTING,
    FilterSyntaxError,
    Predicate,
    cached_filter,
    compile_sql92,
)

__all__ = [
    "MAX_DEPTH", "MAX_LENGTH", "MAX_NESTING", "FilterSyntaxError", "Predicate", "cached_filter", "compile_sql92",
]
