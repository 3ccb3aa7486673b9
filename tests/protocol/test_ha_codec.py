"""The auto-switch HA codec: the byte layouts of AutoSwitchHAClient/AutoSwitchHAConnection, incremental decoding
over any split of the stream, and garbage that either decodes or raises HAProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol import ha
from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError
from cometmq.protocol.ha import (
    EpochEntry,
    HAProtocolError,
    MasterFrameDecoder,
    MasterHandshake,
    SlaveFrameDecoder,
    SlaveHandshake,
    SlaveReport,
    Transfer,
)

I32 = (1 << 31) - 1
I64 = (1 << 63) - 1


# -- the layouts, byte for byte -------------------------------------------------------------------------------------
def test_sizes() -> None:
    assert (ha.SLAVE_HANDSHAKE_SIZE, ha.SLAVE_REPORT_SIZE) == (16, 12)
    assert (ha.MASTER_HANDSHAKE_HEADER_SIZE, ha.TRANSFER_HEADER_SIZE, ha.EPOCH_ENTRY_SIZE) == (20, 36, 12)
    assert [s.value for s in ha.HAState] == [0, 1, 2, 3, 4]


def test_slave_handshake_layout() -> None:
    data = ha.encode_slave_handshake(7, sync_from_last_file=True)
    assert data == bytes.fromhex("00000001" "0001" "0000" "0000000000000007")
    assert SlaveFrameDecoder().feed(data) == [SlaveHandshake(7, True, False)]
    assert ha.encode_slave_handshake(2, async_learner=True)[4:8] == bytes.fromhex("00000001")


def test_slave_report_layout() -> None:
    data = ha.encode_slave_report(0x0102030405)
    assert data == bytes.fromhex("00000002" "0000000102030405")
    assert SlaveFrameDecoder().feed(data) == [SlaveReport(0x0102030405)]


def test_master_handshake_layout() -> None:
    data = ha.encode_master_handshake(500, [(1, 0), (3, 200)])
    assert data == bytes.fromhex(
        "00000001" "00000018" "00000000000001f4" "00000003"  # state, body 2 x 12, max offset, last epoch
        "00000001" "0000000000000000" "00000003" "00000000000000c8")
    assert MasterFrameDecoder().feed(data) == [MasterHandshake(500, 3, (EpochEntry(1, 0), EpochEntry(3, 200)))]


def test_master_handshake_without_epochs_says_last_epoch_minus_one() -> None:
    data = ha.encode_master_handshake(0, [])
    assert data == bytes.fromhex("00000001" "00000000" "0000000000000000" "ffffffff")
    assert MasterFrameDecoder().feed(data) == [MasterHandshake(0, -1, ())]


def test_transfer_layout() -> None:
    header = ha.encode_transfer_header(1000, 4, 900, 950, 3)
    assert header == bytes.fromhex("00000002" "00000003" "00000000000003e8" "00000004" "0000000000000384"
                                   "00000000000003b6")
    assert ha.encode_transfer(1000, 4, 900, 950, b"abc") == header + b"abc"
    frame = MasterFrameDecoder().feed(header + b"abc")[0]
    assert frame == Transfer(1000, 4, 900, 950, b"abc")
    assert isinstance(frame, Transfer) and not frame.is_heartbeat
    assert "3 bytes" in repr(frame)


def test_heartbeat_and_javas_early_heartbeat() -> None:
    (hb,) = MasterFrameDecoder().feed(ha.encode_transfer(100, 2, 50, 90))
    assert isinstance(hb, Transfer) and hb.is_heartbeat
    # Java sends nextTransferFromWhere = -1 before it knows where to start; confirmOffset starts at -1
    (early,) = MasterFrameDecoder().feed(ha.encode_transfer_header(-1, 1, 0, -1, 0))
    assert early == Transfer(-1, 1, 0, -1)


def test_error_is_a_remote_protocol_error_and_a_value_error() -> None:
    assert issubclass(HAProtocolError, RemoteProtocolError)
    assert issubclass(HAProtocolError, ValueError)


# -- encoders refuse what the wire cannot carry ---------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda: ha.encode_slave_handshake(-1),
    lambda: ha.encode_slave_report(-1),
    lambda: ha.encode_slave_report(I64 + 1),
    lambda: ha.encode_master_handshake(-1, []),
    lambda: ha.encode_master_handshake(10, [(2, 0), (1, 5)]),
    lambda: ha.encode_master_handshake(10, [(1, 5), (2, 0)]),
    lambda: ha.encode_master_handshake(10, [(I32 + 1, 0)]),
    lambda: ha.encode_transfer_header(-1, 1, 0, 0, 5),
    lambda: ha.encode_transfer_header(0, -1, 0, 0, 0),
    lambda: ha.encode_transfer_header(0, 1, 0, 0, I32 + 1),
    lambda: ha.encode_frame(MasterHandshake(10, 5, (EpochEntry(1, 0),))),
])
def test_encoders_refuse_out_of_range(call: object) -> None:
    with pytest.raises(LocalProtocolError):
        call()  # type: ignore[operator]


# -- decoders refuse garbage ----------------------------------------------------------------------------------------
def _raw_master_handshake(body_size: int, max_offset: int, last_epoch: int, body: bytes) -> bytes:
    return struct.pack(">iiqi", 1, body_size, max_offset, last_epoch) + body


@pytest.mark.parametrize(("data", "message"), [
    (struct.pack(">iiqi", 0, 0, 0, 0), "state 0 .READY."),
    (struct.pack(">iiqi", 4, 0, 0, 0), "state 4 .SHUTDOWN."),
    (struct.pack(">iiqi", 99, 0, 0, 0), "state 99 .unknown."),
    (struct.pack(">iiqiqq", 2, -5, 0, 1, 0, 0), "body size -5"),
    (struct.pack(">iiqiqq", 2, 1 << 30, 0, 1, 0, 0), "over the limit"),
    (_raw_master_handshake(13, 0, 1, b"\0" * 13), "not a whole number"),
    (_raw_master_handshake(12, -1, 1, struct.pack(">iq", 1, 0)), "max offset -1"),
    (_raw_master_handshake(12, 5, 2, struct.pack(">iq", 1, 0)), "last epoch 2"),
    (_raw_master_handshake(0, 5, 3, b""), "last epoch 3 with no entries"),
    (_raw_master_handshake(24, 5, 1, struct.pack(">iqiq", 2, 0, 1, 3)), "out of order"),
    (_raw_master_handshake(24, 5, 2, struct.pack(">iqiq", 1, 9, 2, 3)), "out of order"),
    (_raw_master_handshake(12, 5, 1, struct.pack(">iq", 1, -3)), "negative"),
    (struct.pack(">iiqiqq", 2, 1, -1, 1, 0, 0) + b"x", "offset -1"),
    (struct.pack(">iiqiqq", 2, 1, 10, 1, 20, 0) + b"x", "before its epoch's start"),
    (struct.pack(">iiqiqq", 2, 0, 10, -1, 0, 0), "epoch -1"),
    (struct.pack(">iiqiqq", 2, 0, 10, 1, 0, -2), "confirm -2"),
])
def test_master_decoder_refuses(data: bytes, message: str) -> None:
    decoder = MasterFrameDecoder(max_body=1 << 20)
    with pytest.raises(HAProtocolError, match=message):
        decoder.feed(data)
    with pytest.raises(HAProtocolError):  # broken for good: the link must close
        decoder.feed(ha.encode_transfer(0, 1, 0, 0))


@pytest.mark.parametrize(("data", "message"), [
    (struct.pack(">iq", 3, 0), "state 3 .SUSPEND."),
    (struct.pack(">iq", -1, 0), "state -1 .unknown."),
    (struct.pack(">iq", 2, -1), "offset -1"),
    (struct.pack(">ihhq", 1, 2, 0, 1), "flags 2, 0"),
    (struct.pack(">ihhq", 1, 0, -1, 1), "flags 0, -1"),
    (struct.pack(">ihhq", 1, 0, 0, -1), "broker id -1"),
])
def test_slave_decoder_refuses(data: bytes, message: str) -> None:
    decoder = SlaveFrameDecoder()
    with pytest.raises(HAProtocolError, match=message):
        decoder.feed(data)
    with pytest.raises(HAProtocolError):
        decoder.feed(ha.encode_slave_report(1))


def test_body_limit_is_configurable() -> None:
    data = ha.encode_transfer(0, 1, 0, 0, b"x" * 100)
    assert len(MasterFrameDecoder(max_body=100).feed(data)) == 1
    with pytest.raises(HAProtocolError, match="101 bytes is over the limit of 100"):
        MasterFrameDecoder(max_body=100).feed(ha.encode_transfer(0, 1, 0, 0, b"x" * 101))
    # refused from the header alone, before the body arrives
    with pytest.raises(HAProtocolError):
        MasterFrameDecoder(max_body=100).feed(ha.encode_transfer_header(0, 1, 0, 0, 10_000))
    with pytest.raises(ValueError):
        MasterFrameDecoder(max_body=-1)


def test_partial_frames_wait_for_more() -> None:
    decoder = MasterFrameDecoder()
    data = ha.encode_master_handshake(10, [(1, 0)]) + ha.encode_transfer(0, 1, 0, 0, b"0123456789")
    assert decoder.feed(data[:7]) == []
    assert decoder.buffered == 7
    assert decoder.feed(data[7:40]) == [MasterHandshake(10, 1, (EpochEntry(1, 0),))]
    assert decoder.feed(data[40:]) == [Transfer(0, 1, 0, 0, b"0123456789")]
    assert decoder.buffered == 0


# -- properties -----------------------------------------------------------------------------------------------------
offsets = st.integers(0, I64)
epochs = st.integers(0, I32)


@st.composite
def epoch_lists(draw: st.DrawFn) -> tuple[EpochEntry, ...]:
    es = sorted(set(draw(st.lists(epochs, max_size=6))))
    starts = sorted(draw(st.lists(offsets, min_size=len(es), max_size=len(es))))
    return tuple(EpochEntry(e, s) for e, s in zip(es, starts, strict=True))


@st.composite
def transfers(draw: st.DrawFn) -> Transfer:
    body = draw(st.binary(max_size=64))
    start = draw(offsets)
    return Transfer(start, draw(epochs), draw(st.integers(0, start)), draw(st.integers(-1, I64)), body)


@st.composite
def master_handshakes(draw: st.DrawFn) -> MasterHandshake:
    entries = draw(epoch_lists())
    return MasterHandshake(draw(offsets), entries[-1].epoch if entries else -1, entries)


slave_frames = st.one_of(
    st.builds(SlaveHandshake, offsets, st.booleans(), st.booleans()),
    st.builds(SlaveReport, offsets),
)
master_frames = st.one_of(master_handshakes(), transfers())


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300)
@given(st.lists(slave_frames, max_size=8), st.lists(st.integers(0, 1 << 16), max_size=10))
def test_slave_frames_roundtrip_over_any_split(frames: list[ha.SlaveFrame], cuts: list[int]) -> None:
    data = b"".join(ha.encode_frame(f) for f in frames)
    decoder = SlaveFrameDecoder()
    out: list[ha.SlaveFrame] = []
    for chunk in _split(data, cuts):
        out += decoder.feed(chunk)
    assert out == frames
    assert decoder.buffered == 0


@settings(max_examples=300)
@given(st.lists(master_frames, max_size=6), st.lists(st.integers(0, 1 << 16), max_size=10))
def test_master_frames_roundtrip_over_any_split(frames: list[ha.MasterFrame], cuts: list[int]) -> None:
    data = b"".join(ha.encode_frame(f) for f in frames)
    decoder = MasterFrameDecoder()
    out: list[ha.MasterFrame] = []
    for chunk in _split(data, cuts):
        out += decoder.feed(memoryview(chunk))
    assert out == frames
    assert decoder.buffered == 0


def _garbage(valid: bytes, noise: bytes, at: int, mode: int) -> bytes:
    """Valid frames damaged: bytes overwritten, inserted or cut at ``at``, or plain noise."""
    at %= len(valid) + 1
    if mode == 0:
        return noise
    if mode == 1:
        return valid[:at] + noise + valid[at + len(noise):]
    if mode == 2:
        return valid[:at] + noise + valid[at:]
    return valid[:at]


@settings(max_examples=600)
@given(st.lists(master_frames, min_size=1, max_size=3), st.binary(max_size=40), st.integers(0, 1 << 12),
       st.integers(0, 3), st.lists(st.integers(0, 1 << 12), max_size=4))
def test_master_garbage_decodes_or_raises(frames: list[ha.MasterFrame], noise: bytes, at: int, mode: int,
                                          cuts: list[int]) -> None:
    data = _garbage(b"".join(ha.encode_frame(f) for f in frames), noise, at, mode)
    decoder = MasterFrameDecoder(max_body=1 << 16)
    try:
        for chunk in _split(data, cuts):
            for frame in decoder.feed(chunk):
                assert ha.encode_frame(frame)  # what decodes is a frame we could send
    except HAProtocolError:
        pass


@settings(max_examples=600)
@given(st.lists(slave_frames, min_size=1, max_size=4), st.binary(max_size=40), st.integers(0, 1 << 12),
       st.integers(0, 3), st.lists(st.integers(0, 1 << 12), max_size=4))
def test_slave_garbage_decodes_or_raises(frames: list[ha.SlaveFrame], noise: bytes, at: int, mode: int,
                                         cuts: list[int]) -> None:
    data = _garbage(b"".join(ha.encode_frame(f) for f in frames), noise, at, mode)
    decoder = SlaveFrameDecoder()
    try:
        for chunk in _split(data, cuts):
            for frame in decoder.feed(chunk):
                assert ha.encode_frame(frame)
    except HAProtocolError:
        pass


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_pure_noise_decodes_or_raises(data: bytes) -> None:
    for decoder in (MasterFrameDecoder(max_body=1 << 12), SlaveFrameDecoder()):
        try:
            for frame in decoder.feed(data):
                assert ha.encode_frame(frame)
        except HAProtocolError:
            pass
