"""cometmq's own .proto files: the wire facts the 5.x clients depend on, and generated modules in step."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb

ROOT = Path(__file__).resolve().parents[2]


def test_service_methods_and_streaming() -> None:
    svc = spb.DESCRIPTOR.services_by_name["MessagingService"]
    assert svc.full_name == "apache.rocketmq.v2.MessagingService"
    kinds = {m.name: (m.client_streaming, m.server_streaming) for m in svc.methods}
    assert kinds["Telemetry"] == (True, True)
    assert kinds["ReceiveMessage"] == (False, True) and kinds["PullMessage"] == (False, True)
    unary = {"QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage",
             "ForwardMessageToDeadLetterQueue", "UpdateOffset", "GetOffset", "QueryOffset", "EndTransaction",
             "NotifyClientTermination", "ChangeInvisibleDuration", "RecallMessage", "SyncLiteSubscription"}
    assert {n for n, k in kinds.items() if k == (False, False)} == unary


def test_field_numbers_the_clients_rely_on() -> None:
    sp = pb.SystemProperties.DESCRIPTOR.fields_by_name
    assert (sp["message_id"].number, sp["receipt_handle"].number, sp["delivery_attempt"].number,
            sp["message_group"].number, sp["delivery_timestamp"].number) == (3, 12, 16, 17, 11)
    tc = spb.TelemetryCommand.DESCRIPTOR.fields_by_name
    assert tc["settings"].number == 2 and tc["recover_orphaned_transaction_command"].number == 5
    assert spb.SendResultEntry.DESCRIPTOR.fields_by_name["recall_handle"].number == 5
    assert (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND, pb.Code.UNAUTHORIZED, pb.Code.INVALID_RECEIPT_HANDLE,
            pb.Code.UNSUPPORTED) == (20000, 40401, 40100, 40013, 50500)


def test_generated_modules_match_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (extra grpc-codegen) is not installed")
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "proto", work / "proto")
    (work / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gen-proto", work / "scripts" / "gen-proto")
    subprocess.run(["bash", str(work / "scripts" / "gen-proto")], check=True, env={"PYTHON": sys.executable,
                   "PATH": "/usr/bin:/bin"}, capture_output=True)
    generated = work / "src" / "cometmq" / "grpc" / "v2"
    for path in sorted(generated.glob("*_pb2*.py")):
        committed = ROOT / "src" / "cometmq" / "grpc" / "v2" / path.name
        assert committed.read_text() == path.read_text(), f"{path.name} is stale: run scripts/gen-proto"
