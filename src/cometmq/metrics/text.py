"""Metric families as plain data, and their Prometheus text exposition written directly.

The collector (collector.py) reads the broker into :class:`Family` / :class:`HistogramFamily` objects on the
broker's loop: label values and numbers only (strings, ints, floats, fresh lists), nothing of the broker's own, so
that :func:`exposition` may run in another thread while the loop goes on changing the broker.

:func:`exposition` writes what prometheus_client's ``generate_latest`` writes for the same families, byte for byte
(tests/metrics/test_prometheus.py compares them): ``# HELP``/``# TYPE`` lines, counters named ``<name>_total``, labels
sorted by name, histograms as ``_bucket`` (``le`` among the labels), ``_count`` and ``_sum``, numbers as Go formats
them. ``generate_latest`` builds a sample object and a label dict per series and validates and escapes each label
name on every line: on a broker with 10,000 consumer groups (~50,000 series) it took about a second. Here the label
names are checked once per family, a label set shared by several families (the five consumer-lag gauges) is
written once, and a number that is a small int is written without a float round trip.
"""

from __future__ import annotations

import re

from prometheus_client.utils import floatToGoString

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TYPES = frozenset({"counter", "gauge", "histogram"})


class Family:
    """A counter or a gauge: ``rows`` of (label values in the order of ``labels``, value). A counter's ``name`` is
    without ``_total`` (the exposition adds it)."""

    __slots__ = ("help", "labels", "name", "rows", "type")

    def __init__(self, name: str, type_: str, help_: str, labels: tuple[str, ...]) -> None:
        if type_ not in _TYPES or not _LEGACY_NAME.match(name) or not all(map(_LEGACY_LABEL.match, labels)):
            raise ValueError(f"metric {name!r}: a bad type {type_!r} or a bad name among {labels!r}")
        self.name = name
        self.type = type_
        self.help = help_
        self.labels = labels
        self.rows: list[tuple[tuple[str, ...], float]] = []

    def add(self, values: tuple[str, ...], value: float) -> None:
        self.rows.append((values, value))


class HistogramFamily(Family):
    """A histogram: ``buckets`` rows of (label values, [(le, cumulative count), ..., ("+Inf", count)], sum)."""

    __slots__ = ("buckets",)

    def __init__(self, name: str, help_: str, labels: tuple[str, ...]) -> None:
        super().__init__(name, "histogram", help_, labels)
        self.buckets: list[tuple[tuple[str, ...], list[tuple[str, float]], float]] = []

    def add_histogram(self, values: tuple[str, ...], buckets: list[tuple[str, float]], sum_value: float) -> None:
        self.buckets.append((values, buckets, sum_value))


def escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def number(value: float) -> str:
    """``floatToGoString(value)``; an int under 10**6 (the most of them) without building a float."""
    if type(value) is int and -1_000_000_000_000_000 < value < 1_000_000:
        return f"{value}.0"
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def _label_writer(labels: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """The order in which the label values are written (sorted by name) and each one's ``name="`` prefix."""
    order = sorted(range(len(labels)), key=labels.__getitem__)
    return order, [f'{labels[i]}="' for i in order]


#: lines per piece of :func:`exposition_pieces` (~1 MB): each piece is joined and encoded in one go, holding the GIL
_LINES = 4096


def exposition(families: list[Family]) -> bytes:
    """The whole text in one ``bytes``."""
    return b"".join(exposition_pieces(families))


def exposition_pieces(families: list[Family]) -> list[bytes]:
    """The text in pieces of about a megabyte: written in a thread, it holds the GIL (so the broker's loop) for no
    longer than one piece's joining and encoding at a time, and the loop sends it piece by piece (a 10 MB answer
    joined, copied or encoded in one go holds it ~10 ms each time)."""
    pieces: list[bytes] = []
    out: list[str] = []
    # label set (names) -> (label values -> the text between the braces), for families that share both
    shared: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
    for f in families:
        name = f.name + "_total" if f.type == "counter" else f.name
        out.append(f"# HELP {name} {f.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
        out.append(f"# TYPE {name} {f.type}\n")
        order, prefixes = _label_writer(f.labels)
        if isinstance(f, HistogramFamily):
            _histogram(out, f, order, prefixes)
            if len(out) >= _LINES:
                pieces.append("".join(out).encode("utf-8"))
                out.clear()
            continue
        if not f.labels:
            out.extend(f"{name} {number(v)}\n" for _, v in f.rows)
            continue
        texts = shared.setdefault(f.labels, {})
        pairs = list(zip(order, prefixes, strict=True))
        for values, v in f.rows:
            text = texts.get(values)
            if text is None:
                text = texts[values] = '",'.join([p + escape_value(values[i]) for i, p in pairs]) + '"'
            out.append(f"{name}{{{text}}} {number(v)}\n")
            if len(out) >= _LINES:
                pieces.append("".join(out).encode("utf-8"))
                out.clear()
    pieces.append("".join(out).encode("utf-8"))
    return pieces


def _histogram(out: list[str], f: HistogramFamily, order: list[int], prefixes: list[str]) -> None:
    names = [f.labels[i] for i in order]
    at = sum(1 for n in names if n < "le")  # where "le" goes among the sorted names
    for values, buckets, sum_value in f.buckets:
        parts = [p + escape_value(values[i]) + '"' for i, p in zip(order, prefixes, strict=True)]
        before, after = ",".join(parts[:at]), ",".join(parts[at:])
        head = f"{f.name}_bucket{{{before}{',' if before else ''}le=\""
        tail = f"\"{',' if after else ''}{after}}} "
        for le, count in buckets:
            out.append(f"{head}{escape_value(le)}{tail}{number(count)}\n")
        labels = f"{{{','.join(parts)}}}" if parts else ""
        out.append(f"{f.name}_count{labels} {number(buckets[-1][1])}\n")
        out.append(f"{f.name}_sum{labels} {number(sum_value)}\n")
