"""Sans-I/O protocol layer: bytes in, objects out. Imports no sockets, asyncio or files."""
