"""Builds the optional C helpers: the key index's (cometmq.store._indexc) and the Spark source's record decoder
(cometmq.spark._decodec). Everything else is in pyproject.toml.

``optional=True``: without a compiler or Python headers the install still succeeds and the index and the Spark
decoder run in pure Python (same results, more CPU)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cometmq.store._indexc", ["src/cometmq/store/_indexc.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("cometmq.spark._decodec", ["src/cometmq/spark/_decodec.c"], optional=True,
                             extra_compile_args=["-O2"])])
