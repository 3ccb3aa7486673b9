"""Java's text rules that RocketMQ's behaviour depends on, kept once for the layers that follow them."""

from __future__ import annotations

#: what Java's ``String.trim()`` strips from both ends: every char <= ' ' (and no other white space, such as U+00A0
#: or U+3000, which ``str.strip()`` would take too). RocketMQ trims tags and SQL92 property values this way.
JAVA_TRIM = "".join(map(chr, range(33)))
