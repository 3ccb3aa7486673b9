"""RawProperties answers exactly as a decoded dict would, without decoding for ``get``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.properties import RawProperties, check_utf8, decode_properties, encode_properties

names = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=0,
                max_size=12)
values = st.text(st.characters(blacklist_characters="\x02", blacklist_categories=("Cs",)), max_size=20)


@given(st.lists(st.tuples(names, values), max_size=8), st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "X", ""]))
def test_get_matches_the_decoded_dict(pairs: list[tuple[str, str]], probe: str) -> None:
    # Built by hand (not encode_properties) so repeated names, empty names and values holding 0x01 occur.
    raw = "".join(f"{n}\x01{v}\x02" for n, v in pairs).encode()
    want = decode_properties(raw)
    lazy = RawProperties(raw)
    for name in [probe, *(n for n, _ in pairs)]:
        assert lazy.get(name) == want.get(name), (raw, name)
        assert lazy.get(name, "dflt") == want.get(name, "dflt")
    assert lazy._dict is None  # get alone never decoded everything
    assert dict(lazy) == want and len(lazy) == len(want)
    assert all((n in lazy) == (n in want) for n, _ in pairs)


def test_names_must_start_a_pair() -> None:
    raw = encode_properties({"XTAGS": "no", "A": "TAGS", "TAGS": "yes"})
    assert RawProperties(raw).get("TAGS") == "yes"
    assert RawProperties(encode_properties({"XTAGS": "no"})).get("TAGS") is None
    assert RawProperties(b"TAGS\x01last-pair-without-separator").get("TAGS") == "last-pair-without-separator"
    assert RawProperties(b"").get("TAGS") is None


def test_a_name_given_twice_answers_the_last_as_the_dict_does() -> None:
    raw = b"TAGS\x01a\x02KEYS\x01k\x02TAGS\x01b\x02"
    assert RawProperties(raw).get("TAGS") == decode_properties(raw)["TAGS"] == "b"


def test_non_ascii_values_and_utf8_check() -> None:
    raw = encode_properties({"TAGS": "étiquette", "KEYS": "键 two"})
    assert RawProperties(raw).get("KEYS") == "键 two"
    check_utf8(raw)
    with pytest.raises(ProtocolError, match="UTF-8"):
        check_utf8(b"TAGS\x01\xff\xfe\x02")
