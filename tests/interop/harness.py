"""Run the interop client scripts (tests/interop/clients/*.py) as subprocesses.

The scripts print one JSON object per stdout line with an ``event`` key (see their docstrings
and docs/interop-notes.md).  :func:`run_client` runs one to completion; :func:`start_client`
starts one in the background (e.g. a push consumer that must be up before a producer sends).

The C++ client writes logs under ``$HOME/logs/rocketmq-cpp/`` and broadcasting offsets under
``$HOME/.rocketmq_offsets/`` -- always pass an env from :func:`client_env` (the
``cpp_client_env`` fixture) so those land in a temporary folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INTEROP_DIR = Path(__file__).resolve().parent
CLIENTS_DIR = INTEROP_DIR / "clients"
FRAME_RECORDER = INTEROP_DIR / "frame_recorder.py"
DATA_DIR = INTEROP_DIR / "data"

# Environment variables the C++ client reads and that must not leak in from the outer shell.
_CLIENT_ENV_DROP = ("NAMESRV_ADDR", "ROCKETMQ_HOME")

# rc of a process killed by SIGABRT (the C++ client's shutdown race, see clients/_common.py).
SIGABRT_RC = -signal.SIGABRT

# Budget for one client subprocess; keep below pytest-timeout (120 s in pyproject.toml).
DEFAULT_CLIENT_TIMEOUT = 60.0


def client_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a client subprocess with HOME (logs, offsets) under ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if base is None else base)
    for key in _CLIENT_ENV_DROP:
        env.pop(key, None)
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def script_path(script: str) -> Path:
    name = script if script.endswith(".py") else f"{script}.py"
    path = CLIENTS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


def client_args(**options: Any) -> list[str]:
    """``client_args(namesrv="h:p", count=3, broadcast=True)`` -> ``["--namesrv", "h:p", ...]``.

    ``True`` gives a bare flag, ``False``/``None`` are dropped, lists repeat the option.
    """
    out: list[str] = []
    for key, val in options.items():
        opt = "--" + key.replace("_", "-")
        if val is None or val is False:
            continue
        if val is True:
            out.append(opt)
        elif isinstance(val, list | tuple):
            for v in val:
                out += [opt, str(v)]
        else:
            out += [opt, str(val)]
    return out


@dataclass
class ClientResult:
    script: str
    argv: list[str]
    returncode: int | None
    lines: list[dict[str, Any]]
    stderr: str
    junk: list[str] = field(default_factory=list)  # non-JSON stdout lines
    timed_out: bool = False
    home: str | None = None

    def events(self, name: str) -> list[dict[str, Any]]:
        return [ln for ln in self.lines if ln.get("event") == name]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """``msg`` lines (consumers) or ``sent`` lines (producer)."""
        return self.events("sent") if self.script.startswith("produce") else self.events("msg")

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.events("error") + self.events("fatal") + self.events("callback_error")

    @property
    def summary(self) -> dict[str, Any] | None:
        found = self.events("summary")
        return found[-1] if found else None

    @property
    def closed(self) -> bool:
        """True if the client shut down cleanly (``closed`` line seen)."""
        return bool(self.events("closed"))

    @property
    def aborted_in_shutdown(self) -> bool:
        """SIGABRT after the data was printed: the C++ client's shutdown race, not our bug."""
        return self.returncode == SIGABRT_RC and not self.closed and (
            bool(self.events("summary")) or bool(self.events("stopping")))

    def log_files(self) -> list[Path]:
        if not self.home:
            return []
        return sorted((Path(self.home) / "logs" / "rocketmq-cpp").glob("*rocketmq-cpp.log*"))

    def describe(self, max_stderr: int = 4000) -> str:
        """Human-readable dump for assertion messages."""
        tail = self.stderr[-max_stderr:]
        return (f"{self.script} {' '.join(self.argv)}\nrc={self.returncode} timed_out={self.timed_out}\n"
                f"last lines: {json.dumps(self.lines[-5:], indent=None)[:3000]}\n"
                f"junk: {self.junk[:5]}\nstderr tail:\n{tail}\nlogs: {[str(p) for p in self.log_files()]}")


def _parse_line(raw: str, lines: list[dict[str, Any]], junk: list[str]) -> None:
    raw = raw.rstrip("\n")
    if not raw:
        return
    try:
        obj = json.loads(raw)
    except ValueError:
        junk.append(raw)
        return
    if isinstance(obj, dict):
        lines.append(obj)
    else:
        junk.append(raw)


def _command(script: str, args: Sequence[str], python: str | None) -> list[str]:
    return [python or sys.executable, str(script_path(script)), *args]


def run_client(script: str, args: Sequence[str], env: Mapping[str, str], timeout: float = 60.0,
               python: str | None = None, cwd: Path | None = None) -> ClientResult:
    """Run a client script to completion (killed after ``timeout`` seconds) and parse its output."""
    cmd = _command(script, args, python)
    try:
        proc = subprocess.run(cmd, env=dict(env), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, check=False)
        stdout, stderr, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        rc, timed_out = None, True
    lines: list[dict[str, Any]] = []
    junk: list[str] = []
    for raw in stdout.splitlines():
        _parse_line(raw, lines, junk)
    return ClientResult(Path(cmd[1]).name, list(args), rc, lines, stderr, junk, timed_out, env.get("HOME"))


class ClientProcess:
    """A client script running in the background; stdout lines are parsed as they arrive."""

    def __init__(self, script: str, args: Sequence[str], env: Mapping[str, str],
                 python: str | None = None, cwd: Path | None = None) -> None:
        self.script = script_path(script).name
        self.argv = list(args)
        self.home = env.get("HOME")
        self.lines: list[dict[str, Any]] = []
        self.junk: list[str] = []
        self._stderr: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(_command(script, args, python), env=dict(env), cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._readers:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                _parse_line(raw, self.lines, self.junk)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw)

    def wait_for(self, event: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Block until ``count`` lines with ``event`` arrived; raises TimeoutError (or if the process
        exits first)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [ln for ln in self.lines if ln.get("event") == event]
                if len(found) >= count:
                    return found
                if self.proc.poll() is not None and not self._readers[0].is_alive():
                    raise TimeoutError(f"{self.script} exited (rc={self.proc.returncode}) before "
                                       f"{count} {event!r} lines; got {len(found)}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.script}: {len(found)}/{count} {event!r} lines "
                                       f"after {timeout}s")
                self._cond.wait(min(remaining, 0.2))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask the script to stop (push_consume shuts down cleanly on SIGTERM/SIGINT)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 60.0) -> ClientResult:
        """Wait for exit (kill after ``timeout``), join the readers and return the result."""
        timed_out = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.proc.kill()
            self.proc.wait()
        for t in self._readers:
            t.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        with self._cond:
            lines, junk = list(self.lines), list(self.junk)
        return ClientResult(self.script, self.argv, self.proc.returncode, lines, "".join(self._stderr), junk,
                            timed_out, self.home)

    def __enter__(self) -> ClientProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop()
        self.finish(timeout=30)


def start_client(script: str, args: Sequence[str], env: Mapping[str, str], python: str | None = None,
                 cwd: Path | None = None) -> ClientProcess:
    return ClientProcess(script, args, env, python=python, cwd=cwd)


class CppClientRunner:
    """Runs tests/interop/clients/<script>.py with a fixed env; options as keyword arguments."""

    def __init__(self, env: Mapping[str, str], python: str) -> None:
        self.env = dict(env)
        self.python = python
        self.started: list[ClientProcess] = []

    def run(self, script: str, *extra: str, timeout: float = DEFAULT_CLIENT_TIMEOUT,
            env: Mapping[str, str] | None = None, **options: Any) -> ClientResult:
        return run_client(script, [*client_args(**options), *extra], env or self.env, timeout=timeout,
                          python=self.python)

    def start(self, script: str, *extra: str, env: Mapping[str, str] | None = None,
              **options: Any) -> ClientProcess:
        proc = start_client(script, [*client_args(**options), *extra], env or self.env, python=self.python)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.proc.poll() is None:
                proc.stop()
                proc.finish(timeout=30)


def check_wheel(env: Mapping[str, str], python: str | None = None, timeout: float = 60.0) -> str | None:
    """Load the wheel in a subprocess; returns None if fine, else a reason string."""
    code = ("from rocketmq.client import Producer, PushConsumer, PullConsumer, Message\n"
            "import rocketmq.ffi as f; print(f._DYLIB_PATH)\n")
    try:
        proc = subprocess.run([python or sys.executable, "-c", code], env=dict(env), capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run the interpreter to import the rocketmq wheel: {exc!r}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return (f"rocketmq==0.4.4 wheel (C++ client librocketmq.so) does not load: {last} -- install it with "
                f"`pip install -e '.[interop]'` (Linux x86_64 only; needs libstdc++6)")
    return None


# --------------------------------------------------------------------------- frame recorder


class FrameRecorder:
    """tests/interop/frame_recorder.py in a subprocess (see its docstring)."""

    def __init__(self, out_dir: Path, respond: bool = True, extra: Sequence[str] = (),
                 python: str | None = None, start_timeout: float = 15.0) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [python or sys.executable, str(FRAME_RECORDER), "--port", "0", "--out", str(out_dir), "--quiet",
               *(["--respond"] if respond else []), *extra]
        self._stderr = open(out_dir / "recorder.stderr", "w", encoding="utf-8")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        stdout = self.proc.stdout
        assert stdout is not None
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(start_timeout)
        if not ready or not ready[0]:
            self.close()
            raise RuntimeError("frame_recorder did not start")
        info = json.loads(ready[0])
        self.host: str = info["host"]
        self.port: int = info["port"]

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def frames_path(self) -> Path:
        return self.out_dir / "frames.jsonl"

    def frames(self) -> list[dict[str, Any]]:
        if not self.frames_path.exists():
            return []
        with open(self.frames_path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def requests(self, code: int | None = None) -> list[dict[str, Any]]:
        return [f for f in self.frames() if f["dir"] == "in" and (code is None or f["code"] == code)]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> FrameRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_hex_frame(path: Path) -> bytes:
    """Read a tests/interop/data/*.hex capture: '#' comment lines, then hex (whitespace ignored)."""
    text = "".join(ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.lstrip().startswith("#"))
    return bytes.fromhex("".join(text.split()))
