from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.taghash import java_string_hash, tags_code

# Expected values were printed by Java's own String.hashCode() (OpenJDK), not derived from our code.
KNOWN = [
    ("TagA", 2598919),
    ("", 0),
    ("\u00e9", 233),  # é: one UTF-16 unit
    ("\U0001f600", 1772899),  # 😀: surrogate pair D83D DE00 -> 31 * 0xD83D + 0xDE00
    ("polygenelubricants", -2147483648),  # wraps to exactly Integer.MIN_VALUE
    ("hello world", 1794106052),
    ("Aa", 2112),
    ("BB", 2112),
    ("\u4e2d\u6587\u6807\u7b7e", 622041809),  # 中文标签
    ("\ud800", 55296),  # a lone surrogate, as a JSON "\ud800" escape produces
]


@pytest.mark.parametrize(("text", "expected"), KNOWN)
def test_java_string_hash_known_answers(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_tags_code_of_no_tag_is_zero() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0


def test_tags_code_is_the_string_hash() -> None:
    assert tags_code("TagA") == 2598919
    assert tags_code("polygenelubricants") == -2147483648


def _utf16_units(text: str) -> list[int]:
    """UTF-16 code units computed from code points by hand, independently of Python's codec."""
    units: list[int] = []
    for ch in text:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    return units


def _reference_hash(text: str) -> int:
    h = 0
    for unit in _utf16_units(text):
        h = (31 * h + unit) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


@settings(max_examples=200)
@given(st.text(max_size=40))
def test_hash_matches_reference_and_is_int32(text: str) -> None:
    h = java_string_hash(text)
    assert -(1 << 31) <= h < 1 << 31
    assert h == _reference_hash(text)


@settings(max_examples=100)
@given(st.text(max_size=20), st.characters(max_codepoint=0xFFFF, codec="utf-8"))
def test_hash_extends_by_31h_plus_unit(prefix: str, ch: str) -> None:
    wrapped = (31 * java_string_hash(prefix) + ord(ch)) & 0xFFFFFFFF
    expected = wrapped - (1 << 32) if wrapped & 0x80000000 else wrapped
    assert java_string_hash(prefix + ch) == expected
