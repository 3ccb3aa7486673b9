from __future__ import annotations

from pathlib import Path

import pytest

from cometmq.store.config import ConfigError, FlushDiskType, StoreConfig, store_config_from_properties


def test_rocketmq_key_names_map_to_fields() -> None:
    cfg = store_config_from_properties({
        "storePathRootDir": "/tmp/x",
        "mappedFileSizeCommitLog": "8388608",
        "mappedFileSizeConsumeQueue": "6000",
        "flushDiskType": "sync_flush",
        "fileReservedTime": "48",
        "deleteWhen": "04;16",
        "messageIndexEnable": "false",
        "brokerName": "ignored-here",
    })
    assert cfg.store_path == Path("/tmp/x")
    assert cfg.commitlog_segment_size == 8 << 20
    assert cfg.consume_queue_units_per_file == 300
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert cfg.file_reserved_time_h == 48
    assert cfg.delete_hours == frozenset({4, 16})
    assert cfg.message_index_enable is False


def test_defaults_follow_rocketmq() -> None:
    cfg = StoreConfig()
    assert cfg.commitlog_segment_size == 1 << 30
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.flush_interval_commitlog_ms == 500
    assert cfg.max_message_size == 4 * 1024 * 1024
    assert cfg.file_reserved_time_h == 72
    assert cfg.delete_hours == frozenset({4})


@pytest.mark.parametrize(("key", "value"), [("flushDiskType", "SOMETIMES"), ("maxMessageSize", "big"),
                                            ("messageIndexEnable", "perhaps")])
def test_bad_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        store_config_from_properties({key: value})


def test_impossible_combination_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_message_size"):
        StoreConfig(commitlog_segment_size=8192, max_message_size=1 << 20)
