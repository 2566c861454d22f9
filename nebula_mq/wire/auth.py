"""What the runtime needs from message authentication: an object that signs, verifies and
seals envelopes. The implementation (per-job HMAC keys, AES-GCM, audit) is
``nebula_mq.security.auth.MessageAuth``; the roles build one and hand it to the runtime,
which never reads key files itself."""

from __future__ import annotations

from typing import Protocol

from nebula_mq.wire.envelope import Envelope, Signer

__all__ = ["EnvelopeAuth", "Signer"]


class EnvelopeAuth(Protocol):
    def signer(self) -> Signer:
        """A signer for one message (it stamps the current time)."""

    def verify(self, envelope: Envelope) -> object:
        """Check the envelope's tag and replay window; a WireError subclass when it fails."""

    def seal(self, frame: bytes | memoryview) -> bytes:
        """The frame encrypted for the job (when ``[security] encrypt_payloads``)."""

    def open(self, sealed: bytes | memoryview) -> bytes:
        """Inverse of :meth:`seal`; a WireError subclass when it fails."""
