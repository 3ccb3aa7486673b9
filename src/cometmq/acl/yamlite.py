"""A strict reader and writer for the small YAML subset ``plain_acl.yml`` uses (no PyYAML dependency).

Read: block mappings and sequences (a sequence item may open a mapping, ``- accessKey: x``), flow sequences of
scalars (``[a, b]``), plain and quoted scalars, ``#`` comments, one optional leading ``---``. ``true``/``false``,
``null``/``~``/nothing and integers are typed as YAML 1.1 types them (``secretKey: 12345678`` reads as an int; the
schema turns it back into a string, as RocketMQ does). Anything else YAML can say (anchors and aliases, tags, flow
mappings, block scalars, several documents, tabs in indentation) is refused with its line number, rather than
read differently from SnakeYAML. Every value's line is kept (``Document.lines``) so the schema can name it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str | int, ...]

_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class Document:
    value: Any
    #: where each value starts: path (keys and list indexes) -> line number (1-based)
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


@dataclass
class _Line:
    no: int
    indent: int
    text: str


def _strip_comment(text: str, no: int) -> str:
    """``text`` without a trailing comment (a ``#`` at the start or after a space, outside quotes)."""
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                if quote == "'" and text[i + 1:i + 2] == "'":
                    i += 2
                    continue
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"" and (i == 0 or text[i - 1] in " \t[,:-"):
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
        i += 1
    if quote:
        raise YamlError(no, f"unterminated {quote} quote")
    return text.rstrip()


def _lines(source: str) -> list[_Line]:
    out: list[_Line] = []
    for no, raw in enumerate(source.splitlines(), 1):
        body = raw.lstrip(" ")
        if body.startswith("\t"):
            raise YamlError(no, "a tab in the indentation (YAML indents with spaces)")
        text = _strip_comment(body, no)
        if not text:
            continue
        if text == "---":
            if out:
                raise YamlError(no, "a second YAML document ('---'): the ACL file holds one")
            continue
        if text == "...":
            raise YamlError(no, "'...' (end of document) is not supported")
        out.append(_Line(no, len(raw) - len(body), text))
    return out


def _split_key(text: str) -> tuple[str, str] | None:
    """``key: value`` -> (key, value); None when the line is not a mapping entry."""
    if text[0] in "'\"":
        end = _quoted_end(text)
        if end is None or not text[end:].startswith(":"):
            return None
        rest = text[end + 1:]
        if rest and not rest.startswith(" "):
            return None
        return text[:end], rest.strip()
    m = re.match(r"([^:]*?):(?: +(.*))?$", text)
    if m is None or m.group(1) == "" or re.search(r"[\[\]{},]", m.group(1)):
        return None
    return m.group(1), (m.group(2) or "").strip()


def _quoted_end(text: str) -> int | None:
    quote = text[0]
    i = 1
    while i < len(text):
        if text[i] == quote:
            if quote == "'" and text[i + 1:i + 2] == "'":
                i += 2
                continue
            return i + 1
        if text[i] == "\\" and quote == '"':
            i += 1
        i += 1
    return None


def _unquote(text: str, no: int) -> str:
    end = _quoted_end(text)
    if end != len(text):
        raise YamlError(no, f"bad quoted string {text}")
    inner = text[1:-1]
    if text[0] == "'":
        return inner.replace("''", "'")
    escapes = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "/": "/", "0": "\0"}
    out, i = [], 0
    while i < len(inner):
        c = inner[i]
        if c == "\\":
            nxt = inner[i + 1:i + 2]
            if nxt not in escapes:
                raise YamlError(no, f"unsupported escape \\{nxt} in {text}")
            out.append(escapes[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _scalar(text: str, no: int) -> Any:
    if not text:
        return None
    first = text[0]
    if first in "'\"":
        return _unquote(text, no)
    if first == "[":
        if not text.endswith("]"):
            raise YamlError(no, f"unterminated flow sequence {text}")
        inner = text[1:-1].strip()
        if not inner:
            return []
        items, buf, quote = [], "", ""
        for c in inner:
            if quote:
                buf += c
                if c == quote:
                    quote = ""
            elif c in "'\"" and not buf.strip():
                quote = c
                buf += c
            elif c == ",":
                items.append(buf.strip())
                buf = ""
            elif c in "[]{}":
                raise YamlError(no, "nested flow collections are not supported")
            else:
                buf += c
        items.append(buf.strip())
        return [_scalar(item, no) for item in items]
    if first == "{":
        raise YamlError(no, f"flow mappings ({text}) are not supported: write the mapping as a block")
    if first in "&*!|>%@`":
        what = {"&": "an anchor", "*": "an alias", "!": "a tag", "|": "a block scalar", ">": "a block scalar"}
        raise YamlError(no, f"{text!r} starts with {first!r}, which YAML reads as {what.get(first, 'reserved')}; "
                            f"quote the value: '{text}'")
    low = text.lower()
    if low in ("true", "yes", "on") and text in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
        return True
    if low in ("false", "no", "off") and text in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return False
    if text in ("null", "Null", "NULL", "~"):
        return None
    if _INT.fullmatch(text):
        return int(text)
    if ": " in text or text.endswith(":"):
        raise YamlError(no, f"{text!r}: a mapping inside a value; quote it if it is one string")
    return text


class _Parser:
    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.doc_lines: dict[Path, int] = {}

    def block(self, i: int, indent: int, path: Path) -> tuple[Any, int]:
        line = self.lines[i]
        if line.text == "-" or line.text.startswith("- "):
            return self.sequence(i, indent, path)
        return self.mapping(i, indent, path)

    def mapping(self, i: int, indent: int, path: Path) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        while i < len(self.lines):
            line = self.lines[i]
            if line.indent < indent:
                break
            if line.indent > indent:
                raise YamlError(line.no, "unexpected indentation")
            if line.text == "-" or line.text.startswith("- "):
                raise YamlError(line.no, "a sequence item where a 'key: value' was expected")
            kv = _split_key(line.text)
            if kv is None:
                raise YamlError(line.no, f"expected 'key: value', got {line.text!r}")
            key_text, value = kv
            if key_text[0] in "?&*!":
                raise YamlError(line.no, f"unsupported key {key_text!r}")
            key = _unquote(key_text, line.no) if key_text[0] in "'\"" else key_text
            if key in out:
                raise YamlError(line.no, f"duplicate key {key!r}")
            sub = (*path, key)
            self.doc_lines[sub] = line.no
            i += 1
            if value:
                out[key] = _scalar(value, line.no)
                continue
            nxt = self.lines[i] if i < len(self.lines) else None
            if nxt is not None and nxt.indent > indent:
                out[key], i = self.block(i, nxt.indent, sub)
            elif nxt is not None and nxt.indent == indent and (nxt.text == "-" or nxt.text.startswith("- ")):
                out[key], i = self.sequence(i, indent, sub)
            else:
                out[key] = None
        return out, i

    def sequence(self, i: int, indent: int, path: Path) -> tuple[list[Any], int]:
        out: list[Any] = []
        while i < len(self.lines):
            line = self.lines[i]
            if line.indent < indent or not (line.text == "-" or line.text.startswith("- ")):
                if line.indent > indent:
                    raise YamlError(line.no, "unexpected indentation")
                break
            if line.indent > indent:
                raise YamlError(line.no, "unexpected indentation")
            sub = (*path, len(out))
            self.doc_lines[sub] = line.no
            rest = line.text[1:]
            item = rest.lstrip(" ")
            if not item:
                i += 1
                nxt = self.lines[i] if i < len(self.lines) else None
                if nxt is not None and nxt.indent > indent:
                    value, i = self.block(i, nxt.indent, sub)
                    out.append(value)
                else:
                    out.append(None)
                continue
            col = indent + 1 + (len(rest) - len(item))
            if item.startswith("- ") or (item[0] not in "'\"[" and _split_key(item) is not None) or (
                    item[0] in "'\"" and _split_key(item) is not None):
                # an item that opens a mapping (or a sequence): read it as a block at the item's column
                self.lines[i] = _Line(line.no, col, item)
                value, i = self.block(i, col, sub)
                out.append(value)
                continue
            out.append(_scalar(item, line.no))
            i += 1
        return out, i


def loads(source: str) -> Document:
    """Parse ``source``; YamlError names the line of the first problem."""
    lines = _lines(source)
    if not lines:
        return Document(None)
    parser = _Parser(lines)
    first = lines[0]
    if first.indent:
        raise YamlError(first.no, "the document starts indented")
    value, i = parser.block(0, 0, ())
    if i < len(lines):
        raise YamlError(lines[i].no, "unexpected indentation")
    return Document(value, parser.doc_lines)


_PLAIN = re.compile(r"[A-Za-z0-9_./%=|-][A-Za-z0-9_./%=|{},*:@-]*")


def _dump_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and not text.endswith(":") and ": " not in text and not _INT.fullmatch(text) \
            and text.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "~") and "{" not in text[:1]:
        return text
    return "'" + text.replace("'", "''") + "'"


def dumps(value: Any) -> str:
    """Write mappings, lists and scalars as block YAML that ``loads`` (and SnakeYAML) read back the same."""
    out: list[str] = []

    def emit(v: Any, indent: int) -> None:
        pad = " " * indent
        if isinstance(v, dict):
            for k, item in v.items():
                if isinstance(item, (dict, list)) and item:
                    out.append(f"{pad}{_dump_scalar(k)}:")
                    emit(item, indent + 2)
                else:
                    out.append(f"{pad}{_dump_scalar(k)}: {_dump_scalar(item) if item != [] else '[]'}")
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, dict) and item:
                    start = len(out)
                    emit(item, indent + 2)
                    out[start] = f"{pad}- {out[start][indent + 2:]}"
                elif isinstance(item, list) and item:
                    out.append(f"{pad}-")
                    emit(item, indent + 2)
                else:
                    out.append(f"{pad}- {_dump_scalar(item)}")
        else:
            out.append(f"{pad}{_dump_scalar(v)}")

    emit(value, 0)
    return "\n".join(out) + "\n"
