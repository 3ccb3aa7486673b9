"""Builds the optional C helper of the key index (cometmq.store._indexc). Everything else is in pyproject.toml.

``optional=True``: without a compiler or Python headers the install still succeeds and the index runs in pure
Python (same files, more CPU)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cometmq.store._indexc", ["src/cometmq/store/_indexc.c"], optional=True,
                             extra_compile_args=["-O2"])])
