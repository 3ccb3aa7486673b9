"""The protocol layer's single error type."""


class ProtocolError(ValueError):
    """Raised when bytes from the outside do not form a valid frame, header or record."""
