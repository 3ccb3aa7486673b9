"""protocol/_sendv2c.c built with the address and undefined-behaviour sanitizers, fed the frames a client may send
that reach its edge cases: any byte a client writes reaches ``decode`` (the broker's send fast path) and
``loads_header`` (every request's header). The optimised build gives no sign of undefined behaviour (a signed
overflow's wrong value may be thrown away, until a compiler decides otherwise); the sanitized build aborts on it.

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

SOURCE = Path(__file__).resolve().parents[2] / "src" / "cometmq" / "protocol" / "_sendv2c.c"

#: run in the child: the sanitized module loaded from argv[1], every case decoded (a sanitizer report aborts)
CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_sendv2c", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
for frame, header in json.loads(sys.stdin.read()):
    mod.decode(bytes.fromhex(frame), 1 << 20)
    mod.loads_header(bytes.fromhex(header))
print("ok")
"""


def _runtime(cc: str, name: str) -> str | None:
    found = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    cc = shutil.which("gcc")
    if cc is None or not SOURCE.exists():
        pytest.skip("no gcc (or no C source) to build a sanitized helper")
    libs = [_runtime(cc, "libasan.so"), _runtime(cc, "libubsan.so")]
    if None in libs:
        pytest.skip("no sanitizer runtimes")
    out = tmp_path_factory.mktemp("sanitized") / f"_sendv2c{sysconfig.get_config_var('EXT_SUFFIX')}"
    built = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                            "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                            f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(out)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"the sanitized build failed here: {built.stderr[-500:]}")
    env = {**os.environ, "LD_PRELOAD": " ".join(str(lib) for lib in libs), "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    return out, env


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


def test_long_numbers_are_read_without_undefined_behaviour(sanitized: tuple[Path, dict[str, str]]) -> None:
    module, env = sanitized
    cases = [(f.hex(), f[8:8 + int.from_bytes(f[5:8], "big")].hex()) for f in long_number_frames()]
    run = subprocess.run([sys.executable, "-c", CHILD, str(module)], input=json.dumps(cases), capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
