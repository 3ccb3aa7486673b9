"""Message filtering: RocketMQ's SQL92 property filter.

Deliberate differences from RocketMQ's evaluator (everything else mirrors it):

* A property that cannot be converted for a comparison (``a > 5`` with ``a = 'x'``) makes that comparison
  unknown; RocketMQ throws, which rejects the message whatever the rest of the expression says. So does
  RocketMQ for a boolean on the left of ``=``/``<>`` and a present property on the right (``TRUE = a``,
  ``(b > 1) <> a``: a cast error there); cometmq compares them as with the operands swapped.
* Integer literals and property conversions use the long range throughout (RocketMQ converts a
  property with ``Integer.valueOf`` when the literal fits an int).
* The literal ``0.0`` is accepted (RocketMQ rejects decimals below ``Double.MIN_VALUE``); hex floats
  in property values are not parsed; NaN compares as in IEEE 754.
* Identifiers may contain ``.`` after the first character; ``--`` comments may end the expression.
* An expression longer than MAX_LENGTH (65,536 characters) is refused, so a compile's time and memory stay
  bounded.

Missing properties (NULL) are not among the differences: they follow RocketMQ's rules exactly, including its
lopsided ``=``/``<>`` (``'x' <> a`` is TRUE without ``a``, ``a <> 'x'`` unknown); cometmq.filter.sql92 lists them.
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
