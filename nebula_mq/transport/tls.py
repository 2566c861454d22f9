"""The client's TLS context: the CA bundle, our certificate and key, TLS >= 1.2, hostname checked.

The identity files are read at every handshake, not once: ``nebula-mq certs rotate`` replaces a
worker's certificate and key while it runs and revokes the old serial, and the brokers check
CRLs at each handshake, so any later connection must present the new files (the brokers read
their own server certificates the same way, ``bypass_pem_cache``). An expired certificate is
refused here, before any handshake, with the command that replaces it.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from typing import Any

import structlog

from nebula_mq.errors import TransportError
from nebula_mq.settings import BrokerSettings

from .identity import check_not_expired

log = structlog.get_logger(__name__)

_Stamp = tuple[tuple[int, int, int], ...]


def _load_identity(ctx: ssl.SSLContext, broker: BrokerSettings) -> ssl.SSLContext:
    """``ctx`` set up as a client of ``broker``: its CA bundle, our certificate, TLS >= 1.2,
    hostname checked."""
    try:
        ctx.load_verify_locations(broker.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = True
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(broker.cert_file, broker.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(
            f"cannot load TLS identity (ca={broker.ca_file!r}, cert={broker.cert_file!r}, "
            f"key={broker.key_file!r}): {exc}"
        ) from None
    return ctx


def _stamp(*files: str) -> _Stamp:
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            out.append((0, 0, 0))
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ClientContext(ssl.SSLContext):
    """A client context that presents the identity files as they are at each handshake.

    ``nebula-mq certs rotate`` replaces a worker's certificate and key while it runs and revokes
    the old serial, so every later handshake must present the new files, also that of a
    connection whose parameters were built once (a publisher's reconnect, the management API's
    requests). ``wrap_socket`` hands the socket to a context loaded from the files' current
    contents (reloaded only when a file changed). While a rotation is half written (the new key
    beside the old certificate) the last identity that loaded is used, and that handshake fails
    and is retried like any refused one.
    """

    def __new__(cls, broker: BrokerSettings) -> ClientContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, broker: BrokerSettings) -> None:
        super().__init__()
        self._broker = broker
        self._files = (broker.cert_file, broker.key_file, broker.ca_file)
        self._lock = threading.Lock()
        _load_identity(self, broker)
        self._current: tuple[_Stamp, ssl.SSLContext] = (_stamp(*self._files), self)

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now (this one while they have not changed)."""
        with self._lock:
            stamp = _stamp(*self._files)
            if stamp != self._current[0]:
                try:
                    self._current = (stamp, _load_identity(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), self._broker))
                except TransportError as exc:
                    log.warning("tls identity not reloaded", cert_file=self._broker.cert_file, error=str(exc))
            return self._current[1]

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        ctx = self.current()
        if ctx is self:
            return super().wrap_socket(sock, *args, **kwargs)
        return ctx.wrap_socket(sock, *args, **kwargs)


def ssl_context(broker: BrokerSettings) -> ClientContext:
    """Client context: our CA only, our certificate (its files' current contents at each
    handshake: :class:`ClientContext`), TLS >= 1.2, hostname checked. An expired certificate is
    a ``CertificateError`` here: the broker would refuse it at every attempt."""
    ctx = ClientContext(broker)  # unreadable or mismatched files: TransportError
    check_not_expired(broker.cert_file)
    return ctx
