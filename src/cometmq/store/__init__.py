"""The message store: commit log, consume queues, index, dispatch, flush, recovery, retention.

Imports nothing from net/, broker/ or asyncio (a test enforces it). Expected outcomes come back
as status values; exceptions are for bugs and for the caller's misuse.
"""
