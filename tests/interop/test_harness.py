"""Self-tests of the interop harness.  None of these needs the cometmq broker."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.harness import (
    CLIENTS_DIR,
    DATA_DIR,
    CppClientRunner,
    FrameRecorder,
    client_env,
    read_hex_frame,
)

SCRIPTS = ["produce", "push_consume", "pull_consume"]
HEX_FILES = sorted(DATA_DIR.glob("*.hex"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_client_script_help(script: str, tmp_path: Path) -> None:
    """--help works without loading the wheel (it is imported after argument parsing)."""
    proc = subprocess.run([sys.executable, str(CLIENTS_DIR / f"{script}.py"), "--help"],
                          env=client_env(tmp_path / "home"), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--namesrv" in proc.stdout
    assert "--topic" in proc.stdout


def test_wheel_loads(rocketmq_wheel: str, cpp_client_env: dict[str, str]) -> None:
    """The rocketmq wheel's librocketmq.so loads in a subprocess (else the fixture skips)."""
    code = ("import rocketmq.client as c, rocketmq.ffi as f\n"
            "assert f._DYLIB_PATH.endswith('librocketmq.so'), f._DYLIB_PATH\n"
            "print(sorted(n for n in ('Producer', 'PushConsumer', 'PullConsumer', 'Message') if hasattr(c, n)))\n")
    proc = subprocess.run([rocketmq_wheel, "-c", code], env=cpp_client_env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "PullConsumer" in proc.stdout


@pytest.mark.parametrize("path", HEX_FILES, ids=[p.stem for p in HEX_FILES])
def test_hex_capture_is_a_cpp_json_frame(path: Path) -> None:
    """Captured frames: length prefix, JSON header (type byte 0) and the ACL 1.0 signature
    (HMAC-SHA1 with the empty secret over sorted extFields values + body) all check out."""
    raw = read_hex_frame(path)
    assert int.from_bytes(raw[:4], "big") == len(raw) - 4
    word = int.from_bytes(raw[4:8], "big")
    assert word >> 24 == 0
    hlen = word & 0xFFFFFF
    header = json.loads(raw[8 : 8 + hlen])
    body = raw[8 + hlen :]
    assert raw[8 + hlen - 1 : 8 + hlen] == b"\n"  # jsoncpp writes a trailing newline
    assert header["language"] == "CPP"
    assert header["version"] == 63
    assert header["flag"] == 0
    m = re.search(r"^# code=(\d+)", path.read_text(encoding="utf-8"), re.M)
    assert m and int(m.group(1)) == header["code"]
    ext = header["extFields"]
    signed = "".join(str(ext[k]) for k in sorted(ext) if k != "Signature").encode() + body
    expected = base64.b64encode(hmac.new(b"", signed, hashlib.sha1).digest()).decode()
    assert ext["Signature"] == expected
    assert ext["AccessKey"] == ""
    assert ext["OnsChannel"] == "ALIYUN"


def test_roundtrip_against_frame_recorder(cpp_client: CppClientRunner, frame_recorder: FrameRecorder) -> None:
    """produce.py -> frame_recorder (fake namesrv+broker) -> pull_consume.py."""
    sent = cpp_client.run("produce", namesrv=frame_recorder.addr, topic="HarnessTopic", count=3,
                          tags="TagA", keys="k-{i}")
    assert sent.returncode == 0, sent.describe()
    assert [m["status"] for m in sent.messages] == ["OK"] * 3
    assert sent.closed

    got = cpp_client.run("pull_consume", namesrv=frame_recorder.addr, topic="HarnessTopic")
    assert got.returncode == 0, got.describe()
    assert sorted(m["body"] for m in got.messages) == ["msg-0", "msg-1", "msg-2"]
    assert {m["msg_id"] for m in got.messages} == {m["msg_id"] for m in sent.messages}
    assert all(m["tags"] == "TagA" for m in got.messages)

    codes = {f["code"] for f in frame_recorder.requests()}
    assert {105, 10, 11, 35} <= codes
    assert list(Path(cpp_client.env["HOME"], "logs", "rocketmq-cpp").glob("*rocketmq-cpp.log*"))
