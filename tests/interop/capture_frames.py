"""Re-capture the request frames in tests/interop/data/*.hex.

Runs frame_recorder.py (answering as name server + broker) and drives the C++ client through
the interop client scripts, then writes the first frame matching each pattern below as hex::

    .venv/bin/python tests/interop/capture_frames.py [--out tests/interop/data] [--keep DIR]

Needs the ``rocketmq`` wheel.  Takes ~15 s.  Client ids contain the pid, and timestamps,
UNIQ_KEYs and signatures change on every run, so a re-capture always produces a diff.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.interop.harness import (
    DATA_DIR,
    FrameRecorder,
    client_args,
    client_env,
    run_client,
    start_client,
)

Frame = dict[str, Any]


def ext(f: Frame) -> dict[str, Any]:
    return f["header"].get("extFields", {})


def body(f: Frame) -> Any:
    return f.get("body_json")


def consumer_model(f: Frame, model: int) -> bool:
    b = body(f) or {}
    return any(cd.get("messageModel") == model for cd in b.get("consumerDataSet", []))


# (file stem, description, predicate over an incoming frame)
PATTERNS: list[tuple[str, str, Callable[[Frame], bool]]] = [
    ("get_routeinfo_by_topic", "105 GET_ROUTEINFO_BY_TOPIC for a user topic",
     lambda f: f["code"] == 105 and ext(f).get("topic") == "CapTopic"),
    ("get_routeinfo_by_topic_retry", "105 for %RETRY%<group> (push consumer start)",
     lambda f: f["code"] == 105 and str(ext(f).get("topic", "")).startswith("%RETRY%")),
    ("send_message_sync", "10 SEND_MESSAGE, sync, tags TagA, keys 'k-0 o-0', body 'msg-0'",
     lambda f: f["code"] == 10 and ext(f).get("topic") == "CapTopic"),
    ("send_message_oneway", "10 SEND_MESSAGE sent with send_oneway (note: flag is 0, not 2)",
     lambda f: f["code"] == 10 and ext(f).get("topic") == "CapOneway"),
    ("send_message_compressed_delay", "10 SEND_MESSAGE, 5000-byte body zlib-compressed (sysFlag 1), "
     "DELAY 3, user property a=b",
     lambda f: f["code"] == 10 and ext(f).get("topic") == "CapBig"),
    ("send_message_batch", "10 SEND_MESSAGE with batch '1': 3 messages in the batch body",
     lambda f: f["code"] == 10 and ext(f).get("topic") == "CapBatch"),
    ("send_message_batch_compressed", "10 SEND_MESSAGE batch '1' + sysFlag 1: whole batch body zlib'd",
     lambda f: f["code"] == 10 and ext(f).get("topic") == "CapBigBatch"),
    ("unregister_client_producer", "35 UNREGISTER_CLIENT from a producer (consumerGroup '')",
     lambda f: f["code"] == 35 and ext(f).get("producerGroup")),
    ("heart_beat_push_clustering", "34 HEART_BEAT, push consumer, CLUSTERING, expression 'TagA || TagB'",
     lambda f: f["code"] == 34 and consumer_model(f, 1) and "TagA" in json.dumps(body(f))),
    ("heart_beat_push_broadcasting", "34 HEART_BEAT, push consumer, BROADCASTING",
     lambda f: f["code"] == 34 and consumer_model(f, 0)),
    ("get_consumer_list_by_group", "38 GET_CONSUMER_LIST_BY_GROUP",
     lambda f: f["code"] == 38),
    ("query_consumer_offset", "14 QUERY_CONSUMER_OFFSET", lambda f: f["code"] == 14),
    ("get_max_offset", "30 GET_MAX_OFFSET (broadcasting consumer start)", lambda f: f["code"] == 30),
    ("pull_message_push", "11 PULL_MESSAGE from a push consumer (sysFlag 6, suspend 15000)",
     lambda f: f["code"] == 11 and ext(f).get("subscription") == "TagA || TagB"),
    ("pull_message_push_commit", "11 PULL_MESSAGE from a push consumer with sysFlag 7 (commit offset)",
     lambda f: f["code"] == 11 and ext(f).get("sysFlag") == 7),
    ("pull_message_pull_consumer", "11 PULL_MESSAGE from the PullConsumer C API (sysFlag 4)",
     lambda f: f["code"] == 11 and ext(f).get("sysFlag") == 4),
    ("consumer_send_msg_back", "36 CONSUMER_SEND_MSG_BACK after RECONSUME_LATER",
     lambda f: f["code"] == 36),
    ("update_consumer_offset", "15 UPDATE_CONSUMER_OFFSET (sent with flag 0 although oneway)",
     lambda f: f["code"] == 15 and ext(f).get("commitOffset") not in ("0", 0)),
    ("lock_batch_mq", "41 LOCK_BATCH_MQ (orderly push consumer)", lambda f: f["code"] == 41),
    ("unlock_batch_mq", "42 UNLOCK_BATCH_MQ (orderly push consumer shutdown)", lambda f: f["code"] == 42),
    ("unregister_client_consumer", "35 UNREGISTER_CLIENT from a consumer",
     lambda f: f["code"] == 35 and ext(f).get("consumerGroup")),
]


def scenario(rec: FrameRecorder, home: Path) -> None:
    env = client_env(home)
    ns = rec.addr

    def produce(topic: str, **kw: Any) -> None:
        res = run_client("produce", client_args(namesrv=ns, topic=topic, **kw), env, timeout=60)
        assert res.returncode == 0, res.describe()

    produce("CapTopic", count=3, tags="TagA,TagB", keys="k-{i} o-{i}")
    produce("CapOneway", count=1, mode="oneway", tags="T1")
    produce("CapBig", count=1, delay_level=3, body_size=5000, property="a=b")
    produce("CapBatch", count=3, mode="batch", tags="T1", keys="k{i}")
    produce("CapBigBatch", count=2, mode="batch", body_size=3000)
    # clustering push consumer, rejects the first delivery -> CONSUMER_SEND_MSG_BACK
    res = run_client("push_consume", client_args(namesrv=ns, topic="CapTopic", group="CG_cap",
                                                 expression="TagA || TagB", count=3, seconds=30,
                                                 reconsume_later_first_n=1), env, timeout=60)
    assert res.returncode == 0, res.describe()
    # orderly push consumer -> LOCK/UNLOCK_BATCH_MQ
    res = run_client("push_consume", client_args(namesrv=ns, topic="CapTopic", group="CG_cap_orderly",
                                                 orderly=True, count=3, seconds=30), env, timeout=60)
    assert res.returncode == 0, res.describe()
    # broadcasting push consumer: starts at the max offset, so produce after it is up
    with start_client("push_consume", client_args(namesrv=ns, topic="CapBroadcast", group="CG_cap_bc",
                                                  broadcast=True, count=2, seconds=30), env) as bc:
        bc.wait_for("started")
        time.sleep(1.0)
        produce("CapBroadcast", count=2)
        bc.wait_for("msg", 2)
    res = run_client("pull_consume", client_args(namesrv=ns, topic="CapTopic", group="CG_cap_pull"), env,
                     timeout=60)
    assert res.returncode == 0, res.describe()


def write_hex(path: Path, frame: Frame, description: str, stamp: str) -> None:
    raw = frame["raw_hex"]
    header = json.dumps(frame["header"], ensure_ascii=True, sort_keys=True)
    lines = [
        f"# {description}",
        f"# code={frame['code']} flag={frame['flag']} frame_bytes={len(raw) // 2} body_bytes={frame['body_len']}",
        f"# captured {stamp} by tests/interop/capture_frames.py: rocketmq==0.4.4 wheel "
        "(rocketmq-client-cpp 1.2.3) -> frame_recorder.py",
        f"# header: {header}",
        "# raw frame below (4-byte length prefix included), hex, whitespace ignored",
    ]
    lines += [raw[i : i + 64] for i in range(0, len(raw), 64)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    ap.add_argument("--keep", type=Path, help="also copy frames.jsonl here")
    args = ap.parse_args()
    stamp = datetime.date.today().isoformat()
    with tempfile.TemporaryDirectory(prefix="cometmq-capture-") as tmp:
        tmp_path = Path(tmp)
        with FrameRecorder(tmp_path / "rec", respond=True) as rec:
            scenario(rec, tmp_path / "home")
            frames = [f for f in rec.frames() if f["dir"] == "in"]
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(rec.frames_path, args.keep / "frames.jsonl")
    args.out.mkdir(parents=True, exist_ok=True)
    missing = []
    for stem, description, pred in PATTERNS:
        match = next((f for f in frames if pred(f)), None)
        if match is None:
            missing.append(stem)
            continue
        write_hex(args.out / f"{stem}.hex", match, description, stamp)
        print(f"wrote {stem}.hex ({match['code']}, {len(match['raw_hex']) // 2} bytes)")
    if missing:
        print(f"no frame matched: {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
