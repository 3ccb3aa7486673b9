"""The protocol layer's two error types, after h11: whose fault it is decides what happens next.

* ``RemoteProtocolError``: the peer sent bytes, a header field or a body we cannot accept. The server's request
  dispatch (``net/connection.py``) answers it with the response code ``codes.bad_request_code`` picks for the
  request and the error text as remark, and keeps the connection; a frame whose boundary is lost closes it.
* ``LocalProtocolError``: we were about to send something the protocol cannot carry: a bug on our side. It is
  never answered as if the peer were wrong: the dispatch logs it with a traceback and answers SYSTEM_ERROR.

``ProtocolError`` is their common base, so ``except ProtocolError`` still catches both. A bare ``ProtocolError``
(a raise site not yet classified: the record codec in ``message.py`` and ``msgid.py``) is answered as before the
split, like any unexpected exception: logged with a traceback and answered SYSTEM_ERROR.
"""


class ProtocolError(ValueError):
    """Bytes, a header or a record that do not follow the protocol (see the two subclasses)."""


class LocalProtocolError(ProtocolError):
    """We built a frame, header or record the protocol cannot carry: a bug on our side, to be logged loudly."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes, a header field or a body that do not follow the protocol."""
