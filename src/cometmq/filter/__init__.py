"""Message filtering: RocketMQ's SQL92 property filter.

Deliberate differences from RocketMQ's evaluator (everything else mirrors it):

* A property that cannot be converted for a comparison (``a > 5`` with ``a = 'x'``) makes that comparison
  unknown; RocketMQ throws, which rejects the message whatever the rest of the expression says.
* Comparisons with a missing property are unknown on either side (RocketMQ answers FALSE for
  ``'x' = a`` and TRUE for ``a = b`` with both missing).
* Integer literals and property conversions use the long range throughout (RocketMQ converts a
  property with ``Integer.valueOf`` when the literal fits an int).
* The literal ``0.0`` is accepted (RocketMQ rejects decimals below ``Double.MIN_VALUE``); hex floats
  in property values are not parsed; NaN compares as in IEEE 754.
* Identifiers may contain ``.`` after the first character; ``--`` comments may end the expression.
* An expression longer than MAX_LENGTH (65,536 characters) is refused, so a compile's time and memory stay
  bounded.
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
