"""What a new page of a mapped file costs on this machine, as the page cache grows and as it reuses freed pages.

    .venv/bin/python bench/bench_page_touch.py [--files 12] [--mib 256]

Writes one byte into every 4 KiB page of ``--files`` preallocated (``posix_fallocate``) files of ``--mib`` MiB
through a shared mapping, as the commit log's writer does, twice: keeping each file (``grow``: the page cache grows
by that much each time, so its pages are memory not used since the machine started, or given back since) and
deleting each file before the next (``reuse``: the pages freed are taken again at once). Prints one JSON line per
mode: µs per page for each file, in order. On a virtual machine whose host backs guest memory on first touch, the
first mode costs several times the second once the memory freed earlier is used up; a broker that has written
gigabytes before a benchmark row pays that on each new page of its log (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path

PAGE = 4096


def touch(path: Path, size: int) -> float:
    """Fault in every page of a new preallocated file through a shared mapping: µs per page."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size)
        start = time.perf_counter()
        for off in range(0, size, PAGE):
            mm[off] = 1
        took = time.perf_counter() - start
        mm.close()
    finally:
        os.close(fd)
    return took / (size // PAGE) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    size = args.mib << 20
    for mode in ("reuse", "grow"):
        folder = Path(tempfile.mkdtemp(prefix="page-touch-", dir=args.dir))
        try:
            per_file = []
            for i in range(args.files):
                path = folder / f"f{i}"
                per_file.append(round(touch(path, size), 2))
                if mode == "reuse":
                    path.unlink()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(json.dumps({"bench": "page_touch", "mode": mode, "file_mib": args.mib, "us_per_page": per_file}))


if __name__ == "__main__":
    main()
