"""Message authentication (HMAC-SHA256, per-job keys), replay checks, optional AES-GCM.

Why HMAC with a per-job key rather than Ed25519 per worker identity:

* **Cost on 10-100 MB tensors.** HMAC-SHA256 streams over the envelope's
  chunks (``encode_envelope`` hands the signer the region as a list of
  chunks, and received envelopes expose a zero-copy view), at SHA-256 speed.
  Ed25519 (PureEdDSA) needs the whole message as one buffer and hashes it
  twice with SHA-512, so every send would first copy the tensors.
* **Who must be told apart.** Within a job, every worker already trusts every
  other worker's tensors (they train one model); what must be kept out is
  anything that is not the job: other tenants, the broker operator, a WAN
  attacker. One secret per job, distributed with the job (like its
  certificates), separates exactly that; a leaked key compromises one job.
* **What is given up:** non-repudiation between workers of the same job (any
  worker of the job could forge another's ``producer``). The TLS client
  certificate and per-role broker permissions still limit what each worker can
  publish where. Documented in docs/security.md.

Tag layout (50 bytes, in the envelope's ``auth_tag``)::

    version u8 (=1) | flags u8 (=0) | key_id 8 B | sent_at_ms u64 LE | HMAC-SHA256 32 B

The MAC covers the first 18 bytes of the tag *and* ``Envelope.signing_bytes()``
(job, flow, step, micro-batch, seq, producer, meta, every tensor byte), under a
MAC key derived from the job secret with HKDF (info ``nebula-mq hmac v1``).

Replays, precisely. A message is *replayed* (:class:`ReplayedMessage`,
dead-lettered) when its signed ``sent_at`` is

1. before the job's incarnation (``KeyRing.incarnation_ms``): a message of an
   earlier run of the same job id (a re-submitted job also gets a new key, so
   such a message usually fails as ``AuthenticationFailed`` first);
2. older than ``window_s`` (default 24 h: a queue may legitimately hold
   messages through a long WAN outage, so size it above the longest outage);
3. more than ``max_skew_s`` in the future.

A copy of a message whose id was *already applied*, inside the window, is a
*duplicate*: the role's :class:`~nebula_mq.runtime.ordered.OrderedInbox` (its
stream's counter) acks and drops it without applying it. Such copies are indistinguishable from
the federation's own at-least-once resends (byte-identical), so they are
harmless by construction rather than alarms.

Payload encryption (optional, :meth:`MessageAuth.seal` / :meth:`MessageAuth.open`):
AES-256-GCM over the *whole* encoded frame (header with tensor shapes and
the tensor bytes), so the broker operator sees neither tensors nor shapes,
only AMQP properties (message id, sizes). Key: HKDF(job secret, info
``nebula-mq aes-gcm v1``), separate from the MAC key. Nonce: 96 random bits per
message from ``os.urandom``, never derived from the message id: a recomputed
message has the same id but possibly different bytes, and reusing a GCM nonce
with different plaintexts breaks GCM. With random nonces NIST SP 800-38D
allows 2**32 messages per key; a job sends far fewer, and ``rotate`` resets it.
Sealed layout: ``b"NBSE" | version u8 | 3 zero | key_id 8 | nonce 12 | ciphertext+tag``,
the first 28 bytes being the AES-GCM associated data.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from nebula_mq.errors import AuthenticationFailed, ReplayedMessage, WireError
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.keys import JobKey, KeyRing, ensure_job_key, job_key_file
from nebula_mq.wire.envelope import Envelope, Signer
from nebula_mq.settings import Settings

log = structlog.get_logger(__name__)

TAG_VERSION = 1
_TAG_HEAD = struct.Struct("<BB8sQ")
TAG_BYTES = _TAG_HEAD.size + 32
SEAL_MAGIC = b"NBSE"
_SEAL_HEAD = struct.Struct("<4sB3x8s12s")
DEFAULT_WINDOW_S = 24 * 3600.0
DEFAULT_MAX_SKEW_S = 300.0
Chunks = Sequence[Union[bytes, memoryview]]


@lru_cache(maxsize=64)
def _derive(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _mac(key: JobKey, head: bytes, chunks: Chunks) -> bytes:
    m = hmac.new(_derive(key.secret, b"nebula-mq hmac v1"), head, hashlib.sha256)
    for c in chunks:
        m.update(c)
    return m.digest()


@dataclass(frozen=True)
class TagInfo:
    """What a verified tag says."""

    key_id: bytes
    # Sender's wall clock when it signed, ms since the epoch (signed, so trustworthy).
    sent_at_ms: int


class MessageAuth:
    """Signs, verifies, replay-checks and optionally seals the envelopes of one job.

    ``audit``: where rejections are recorded (``message_rejected``), or None.
    """

    def __init__(self, ring: KeyRing, *, audit: AuditLog | None = None, window_s: float = DEFAULT_WINDOW_S,
                 max_skew_s: float = DEFAULT_MAX_SKEW_S, consumer: str = "") -> None:
        self.ring = ring
        self.audit = audit
        self.window_s = window_s
        self.max_skew_s = max_skew_s
        # Who verifies (worker id), for the audit record.
        self.consumer = consumer

    # ------------------------------------------------------------------ signing

    def signer(self, now_ms: int | None = None) -> Signer:
        """A ``signer(chunks) -> tag`` for ``encode_envelope(env, signer=...)``.

        Call it per message (it stamps the current time) unless ``now_ms`` is fixed.
        """
        key = self.ring.current

        def sign(chunks: Chunks) -> bytes:
            sent = int(time.time() * 1000) if now_ms is None else now_ms
            head = _TAG_HEAD.pack(TAG_VERSION, 0, key.key_id, sent)
            return head + _mac(key, head, chunks)

        return sign

    # ------------------------------------------------------------------ verifying

    def verify(self, envelope: Envelope, now: float | None = None) -> TagInfo:
        """Check ``envelope.auth_tag`` over ``envelope.signing_bytes()`` and the replay rules.

        Raises :class:`AuthenticationFailed` (missing, malformed, unknown key,
        wrong MAC) or :class:`ReplayedMessage`; both are WireErrors, so the
        channel dead-letters the message. Each failure is audited.
        """
        try:
            info = self._check_tag(envelope)
            self._check_time(info, time.time() if now is None else now)
            return info
        except WireError as exc:
            self._audit_rejection(envelope, exc)
            raise

    def _check_tag(self, envelope: Envelope) -> TagInfo:
        tag = bytes(envelope.auth_tag)
        if not tag:
            raise AuthenticationFailed("message carries no authentication tag")
        if len(tag) != TAG_BYTES:
            raise AuthenticationFailed(f"authentication tag of {len(tag)} bytes, expected {TAG_BYTES}")
        version, flags, key_id, sent = _TAG_HEAD.unpack_from(tag)
        if version != TAG_VERSION or flags:
            raise AuthenticationFailed(f"authentication tag version {version}/{flags} unsupported")
        key = self.ring.find(key_id)
        if key is None:
            raise AuthenticationFailed(f"message signed with key {key_id.hex()}, not a key of job "
                                       f"{self.ring.job_id!r} (forged, or another job's)")
        expected = _mac(key, tag[:_TAG_HEAD.size], [envelope.signing_bytes()])
        if not hmac.compare_digest(expected, tag[_TAG_HEAD.size:]):
            raise AuthenticationFailed("authentication tag does not match the message (forged or altered)")
        return TagInfo(key_id, sent)

    def _check_time(self, info: TagInfo, now: float) -> None:
        sent = info.sent_at_ms / 1000
        if info.sent_at_ms < self.ring.incarnation_ms:
            raise ReplayedMessage(f"message signed at {sent:.3f}, before this job incarnation started "
                                  f"({self.ring.incarnation_ms / 1000:.3f})")
        if sent < now - self.window_s:
            raise ReplayedMessage(f"message signed {now - sent:.1f}s ago, outside the {self.window_s:g}s window")
        if sent > now + self.max_skew_s:
            raise ReplayedMessage(f"message signed {sent - now:.1f}s in the future (clock skew > "
                                  f"{self.max_skew_s:g}s, or a forged time)")

    def _audit_rejection(self, envelope: Envelope, exc: WireError) -> None:
        if self.audit is None:
            return
        fields = {k: getattr(envelope, a, None) for k, a in
                  (("job", "job_id"), ("flow", "flow"), ("producer", "producer"), ("message_id", "message_id"))}
        self.audit.record("message_rejected", reason=exc.reason, detail=str(exc), consumer=self.consumer,
                          **{k: v for k, v in fields.items() if v is not None})

    # ------------------------------------------------------------------ encryption

    def seal(self, frame: bytes | memoryview) -> bytes:
        """Encrypt an encoded frame (AES-256-GCM, random 96-bit nonce); see the module docstring."""
        key = self.ring.current
        head = _SEAL_HEAD.pack(SEAL_MAGIC, TAG_VERSION, key.key_id, os.urandom(12))
        aead = AESGCM(_derive(key.secret, b"nebula-mq aes-gcm v1"))
        return head + aead.encrypt(head[-12:], bytes(frame), head)

    def open(self, sealed: bytes | memoryview) -> bytes:
        """Decrypt a sealed frame; :class:`AuthenticationFailed` when it was altered or is not ours."""
        data = memoryview(sealed)
        if len(data) < _SEAL_HEAD.size + 16:
            raise AuthenticationFailed("sealed message too short")
        magic, version, key_id, nonce = _SEAL_HEAD.unpack_from(data)
        if magic != SEAL_MAGIC or version != TAG_VERSION:
            raise AuthenticationFailed("message is not sealed (payload encryption is required on this job)")
        key = self.ring.find(key_id)
        if key is None:
            raise AuthenticationFailed(f"message sealed with key {key_id.hex()}, not a key of this job")
        try:
            return AESGCM(_derive(key.secret, b"nebula-mq aes-gcm v1")).decrypt(
                nonce, bytes(data[_SEAL_HEAD.size:]), bytes(data[:_SEAL_HEAD.size]))
        except InvalidTag:
            raise AuthenticationFailed("sealed message fails AES-GCM authentication (altered)") from None


def load_message_auth(settings: Settings, worker_id: str) -> MessageAuth:
    """The job's HMAC key ring (``<run_dir>/keys/job.key``), audited per job, for one worker.

    ``nebula-mq run`` creates the key before starting workers; a worker started
    alone creates it when missing (local runs share the run dir). Across real
    clusters the same key file must be installed on both sides beforehand.
    """
    path = job_key_file(settings.run_dir)
    if not path.exists():
        # Two sides started at once in one run dir do not each write a key: of two rings
        # made at once, one takes the file and the other process reads it (``ensure_job_key``).
        log.warning("job_key_created", path=str(path))
        ensure_job_key(path, settings.job.id)
    audit = AuditLog(settings.run_dir / "audit" / "audit.jsonl")
    return MessageAuth(KeyRing.load(path), audit=audit, consumer=worker_id,
                       window_s=settings.security.replay_window_s)
