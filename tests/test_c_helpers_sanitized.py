"""C helpers built with the address and undefined-behaviour sanitizers, fed the inputs a client may send that reach
their edge cases. protocol/_sendv2c.c: any byte a client writes reaches ``decode`` (the broker's send fast path) and
``loads_header`` (every request's header). spark/_decodec.c: a stored record's timestamps (the born timestamp is the
producer's). The optimised build gives no sign of undefined behaviour (a signed overflow's value is what the
hardware gives, until a compiler decides otherwise); the sanitized build aborts on it.

Skipped where no C compiler or sanitizer runtime is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cometmq.protocol.message import encode_parts, pack_host

SOURCES = Path(__file__).resolve().parents[1] / "src" / "cometmq"

#: run in the child: the sanitized module (argv[2], named argv[1]) loaded, every case run (a sanitizer report aborts)
CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
for case in json.loads(sys.stdin.read()):
    if sys.argv[1] == "_sendv2c":
        mod.decode(bytes.fromhex(case[0]), 1 << 20)
        mod.loads_header(bytes.fromhex(case[1]))
    else:
        assert mod.decode([bytes.fromhex(case)], True, (b"TAGS", b"KEYS", b"UNIQ_KEY"), ()) is not None
print("ok")
"""


def _runtime(cc: str, name: str) -> str | None:
    found = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def build(source: Path, out_dir: Path) -> tuple[Path, dict[str, str]]:
    """``source`` built with the sanitizers into ``out_dir``, and the environment that loads it."""
    cc = shutil.which("gcc")
    if cc is None or not source.exists():
        pytest.skip("no gcc (or no C source) to build a sanitized helper")
    libs = [_runtime(cc, "libasan.so"), _runtime(cc, "libubsan.so")]
    if None in libs:
        pytest.skip("no sanitizer runtimes")
    out = out_dir / f"{source.stem}{sysconfig.get_config_var('EXT_SUFFIX')}"
    built = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                            "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                            f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(out)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"the sanitized build failed here: {built.stderr[-500:]}")
    env = {**os.environ, "LD_PRELOAD": " ".join(str(lib) for lib in libs), "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    return out, env


def run_cases(source: Path, out_dir: Path, cases: list[object]) -> None:
    module, env = build(source, out_dir)
    run = subprocess.run([sys.executable, "-c", CHILD, source.stem, str(module)], input=json.dumps(cases),
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def frame(header: bytes, body: bytes = b"body") -> bytes:
    return (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body


def send_header(code: int = 310, **tops: object) -> dict[str, object]:
    ext = {"a": "pg", "b": "T"} if code == 310 else {"producerGroup": "pg", "topic": "T"}
    return {"code": code, "language": "JAVA", "version": 1, "opaque": 1, "flag": 0, "extFields": ext, **tops}


def long_number_frames() -> list[bytes]:
    """Integers of 18 to 21 digits (and their negatives) everywhere the header reader parses one: the top-level
    fields, a V1 header's integer and boolean fields, an unknown key's value, and any header's number."""
    headers: list[str] = []
    for digits in ("9" * 18, "9" * 19, "1" + "0" * 19, "9" * 21):
        for number in (digits, "-" + digits):
            for key in ("code", "opaque", "flag", "version", "other"):  # (first, so the reader meets it first)
                headers.append(f'{{"{key}": {number}, ' + json.dumps(send_header())[1:])
            for key in ("queueId", "sysFlag", "bornTimestamp", "unitMode", "somethingElse"):
                headers.append(json.dumps(send_header(10)).replace('"topic": "T"', f'"topic": "T", "{key}": {number}'))
    return [frame(h.encode()) for h in headers]


def test_long_numbers_are_read_without_undefined_behaviour(tmp_path: Path) -> None:
    cases = [(f.hex(), f[8:8 + int.from_bytes(f[5:8], "big")].hex()) for f in long_number_frames()]
    run_cases(SOURCES / "protocol" / "_sendv2c.c", tmp_path, list(cases))


def test_far_timestamps_are_read_without_undefined_behaviour(tmp_path: Path) -> None:
    """A born timestamp is what the producer sent (the broker stores any 64-bit value); in microseconds it does not
    fit: the column holds the product wrapped, as the reference's numpy product does, without an overflow."""
    far = [2**62, -(2**62), 2**63 - 1, -(2**63), 9_300_000_000_000_000, 1_700_000_000_000]
    hosts = [pack_host("10.0.0.1", 1), pack_host("::1", 2)]
    records = [encode_parts(topic=b"T", body=b"b", properties=b"TAGS\x01t\x02", born_timestamp=born,
                            store_timestamp=store, born_host=host, store_host=host)
               for born, store, host in zip(far, far[::-1], hosts * 3, strict=True)]
    run_cases(SOURCES / "spark" / "_decodec.c", tmp_path, [r.hex() for r in records])
