"""Reading a broker's Prometheus endpoint (metricsExporterType=PROM): the exposition text format, the subset
prometheus_client writes (``name{label="value",...} number``), summed over the labels a caller groups by."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Sample = tuple[str, dict[str, str], float]


def parse(text: str) -> list[Sample]:
    """Every sample of the text: (name, labels, value); comments and unreadable lines are skipped."""
    out: list[Sample] = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, value))
    return out


def total(samples: Iterable[Sample], name: str, **match: str) -> float:
    """The sum of ``name``'s samples whose labels hold ``match``."""
    return sum(v for n, labels, v in samples if n == name and all(labels.get(k) == w for k, w in match.items()))


def by_label(samples: Iterable[Sample], name: str, label: str, **match: str) -> dict[str, float]:
    """``name``'s samples summed per value of ``label`` (those with ``match``)."""
    out: dict[str, float] = {}
    for n, labels, v in samples:
        if n == name and all(labels.get(k) == w for k, w in match.items()):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out
