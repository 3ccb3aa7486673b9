"""Builds the optional C helpers: the key index's (cometmq.store._indexc), the broker's batch write path
(cometmq.store._batchc, linked with zlib for the body CRC), the transactions' half reader and commit builder
(cometmq.broker.transaction._txc), the SDK's batch encoder (cometmq.protocol._batchenc),
the broker's reader of a lone SEND_MESSAGE_V2 or SEND_MESSAGE frame (cometmq.protocol._sendv2c),
the SDK connection's reply decoder (cometmq.client._sendfast), the Spark source's record decoder
(cometmq.spark._decodec), the Spark sink's batch encoder (cometmq.spark._encodec) and the servers' madvise and
malloc_trim without ctypes (cometmq.common._osc).
Everything else is in pyproject.toml.

``optional=True``: without a compiler or Python headers the install still succeeds and each of them runs in pure
Python (same results, more CPU)."""

from typing import Any

from setuptools import Extension, setup

#: the headers the helpers share (slots-class objects made from C; UTF-8, property and tag-code helpers), as
#: dependencies and on the include path
_SHARED: dict[str, Any] = {"include_dirs": ["src/cometmq/common"],
                           "depends": ["src/cometmq/common/_cslots.h", "src/cometmq/common/_ctext.h",
                                       "src/cometmq/common/_cvalues.h", "src/cometmq/common/_crecord.h"]}

setup(ext_modules=[Extension("cometmq.store._indexc", ["src/cometmq/store/_indexc.c"], optional=True,
                             extra_compile_args=["-O2"], **_SHARED),
                   Extension("cometmq.store._batchc", ["src/cometmq/store/_batchc.c"], optional=True,
                             extra_compile_args=["-O2"], libraries=["z"], **_SHARED),
                   Extension("cometmq.broker.transaction._txc", ["src/cometmq/broker/transaction/_txc.c"],
                             optional=True, extra_compile_args=["-O2"], **_SHARED),
                   Extension("cometmq.common._osc", ["src/cometmq/common/_osc.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("cometmq.protocol._sendv2c", ["src/cometmq/protocol/_sendv2c.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("cometmq.protocol._batchenc", ["src/cometmq/protocol/_batchenc.c"], optional=True,
                             extra_compile_args=["-O2"], **_SHARED),
                   Extension("cometmq.client._sendfast", ["src/cometmq/client/_sendfast.c"], optional=True,
                             extra_compile_args=["-O2"], **_SHARED),
                   Extension("cometmq.spark._decodec", ["src/cometmq/spark/_decodec.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("cometmq.spark._encodec", ["src/cometmq/spark/_encodec.c"], optional=True,
                             extra_compile_args=["-O2"])])
