"""Per-job message keys: a small JSON key ring in a 0600 file.

Why per-job symmetric keys (HMAC) and not per-worker Ed25519 keys: see
``nebula_mq.security.auth``.

The ring lists every key of the job, newest last. The newest signs; every key
in the ring verifies, so rotating a key does not condemn the messages already
queued under the old one (remove it with ``retire_old_keys`` once they drained).
``incarnation_ms`` is when this incarnation of the job was submitted: messages
signed earlier belong to a previous run of the same job id and are replays.

File (``<run_dir>/keys/job.key`` by default, or ``$NEBULA_JOB_KEY_FILE``)::

    {"version": 1, "job": "j1", "incarnation_ms": 1700000000000,
     "keys": [{"id": "<16 hex>", "secret": "<64 hex>", "created_ms": 1700000000000}]}

How the ring crosses to a peer (:func:`seal`, :func:`unseal`): it must be the same file on every
host of a job, and no one should carry it by hand. The cluster that holds it seals it to each
peer cluster's CA certificate (ECIES on the CA's P-256 key: an ephemeral ECDH key, HKDF-SHA256,
AES-256-GCM) and signs the result with its own CA key (ECDSA-SHA256); the sealed copy travels on
a federated queue (``stack.provision`` ``key_flows``). Only the peer's CA key opens it, and the
peer accepts it only when the signature is the CA's it already trusts (``certs import-ca``). The
context (job and clusters) is bound into both, so a sealed key cannot be replayed for another job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from base64 import b64decode, b64encode
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from nebula_mq.errors import SecurityError
from nebula_mq.security.pem import write_private

KEY_FILE_ENV = "NEBULA_JOB_KEY_FILE"
_VERSION = 1


def job_key_file(run_dir: str | os.PathLike[str]) -> Path:
    """Where a job's key ring lives: ``$NEBULA_JOB_KEY_FILE`` or ``<run_dir>/keys/job.key``."""
    override = os.environ.get(KEY_FILE_ENV)
    return Path(override) if override else Path(run_dir) / "keys" / "job.key"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class JobKey:
    # 8 bytes, travels in every tag so the receiver picks the right key after a rotation.
    key_id: bytes
    secret: bytes = b""
    created_ms: int = 0

    def __repr__(self) -> str:  # never print the secret
        return f"JobKey({self.key_id.hex()}, created_ms={self.created_ms})"


def _new_key() -> JobKey:
    secret = secrets.token_bytes(32)
    # The id is derived from the secret (not random) so two rings with the same key agree on it.
    return JobKey(hashlib.sha256(b"nebula-mq key id" + secret).digest()[:8], secret, _now_ms())


@dataclass(frozen=True)
class KeyRing:
    job_id: str
    incarnation_ms: int
    # Newest last; keys[-1] signs.
    keys: tuple[JobKey, ...]

    @property
    def current(self) -> JobKey:
        return self.keys[-1]

    def find(self, key_id: bytes) -> JobKey | None:
        for k in self.keys:
            if k.key_id == key_id:
                return k
        return None

    # ------------------------------------------------------------------ files

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        path = Path(path)
        try:
            if path.stat().st_mode & 0o077:
                raise SecurityError(f"{path}: job key file must not be readable by group or others (chmod 600)")
            raw = json.loads(path.read_text())
            if raw.get("version") != _VERSION:
                raise SecurityError(f"{path}: not a version {_VERSION} key ring")
            keys = tuple(JobKey(bytes.fromhex(k["id"]), bytes.fromhex(k["secret"]), int(k["created_ms"]))
                         for k in raw["keys"])
            ring = cls(str(raw["job"]), int(raw["incarnation_ms"]), keys)
        except FileNotFoundError:
            raise SecurityError(f"{path}: no job key (provision the job first)") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SecurityError(f"{path}: unreadable job key ring ({exc})") from None
        if not keys or any(len(k.secret) != 32 or len(k.key_id) != 8 for k in keys):
            raise SecurityError(f"{path}: job key ring holds no valid 32-byte key")
        return ring

    def save(self, path: str | os.PathLike[str], replace: bool = True) -> KeyRing:
        """Write the ring (mode 0600) and return it; ``replace=False``: only where none is
        (``FileExistsError``)."""
        data = {"version": _VERSION, "job": self.job_id, "incarnation_ms": self.incarnation_ms,
                "keys": [{"id": k.key_id.hex(), "secret": k.secret.hex(), "created_ms": k.created_ms}
                         for k in self.keys]}
        write_private(Path(path), json.dumps(data, indent=1).encode(), replace=replace)
        return self


def ensure_job_key(path: str | os.PathLike[str], job_id: str) -> KeyRing:
    """Load the job's ring, creating it (one fresh key, new incarnation) when absent. Idempotent."""
    path = Path(path)
    if path.exists():
        ring = KeyRing.load(path)
        if ring.job_id != job_id:
            raise SecurityError(f"{path}: key ring of job {ring.job_id!r}, not {job_id!r}")
        return ring
    try:  # two processes making it at once: one ring wins
        return KeyRing(job_id, _now_ms(), (_new_key(),)).save(path, replace=False)
    except FileExistsError:
        return ensure_job_key(path, job_id)


def rotate_job_key(path: str | os.PathLike[str]) -> KeyRing:
    """Add a new signing key; older keys still verify until retired."""
    ring = KeyRing.load(path)
    return KeyRing(ring.job_id, ring.incarnation_ms, (*ring.keys, _new_key())).save(path)


def retire_old_keys(path: str | os.PathLike[str]) -> KeyRing:
    """Keep only the current key (after the queues signed with older ones drained)."""
    ring = KeyRing.load(path)
    return KeyRing(ring.job_id, ring.incarnation_ms, (ring.current,)).save(path)


def new_incarnation(path: str | os.PathLike[str], job_id: str) -> KeyRing:
    """A re-submitted job: fresh key and incarnation, so every old message is refused."""
    return KeyRing(job_id, _now_ms(), (_new_key(),)).save(path)


def ensure_secret(path: str | os.PathLike[str]) -> str:
    """The random password kept in ``path`` (mode 0600), made on first use (a job's monitoring
    user's, for example)."""
    path = Path(path)
    if not path.is_file():
        with contextlib.suppress(FileExistsError):  # made by another process meanwhile: theirs stands
            write_private(path, secrets.token_urlsafe(24).encode(), replace=False)
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise SecurityError(f"{path}: unreadable secret ({exc})") from None


_SEAL_INFO = b"nebula-mq sealed job key v1"


def _aes_key(shared: bytes, context: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=context, info=_SEAL_INFO).derive(shared)


def seal(secret: bytes, recipient: ec.EllipticCurvePublicKey, signer: ec.EllipticCurvePrivateKey,
         context: str) -> bytes:
    """``secret`` readable only with ``recipient``'s private key, signed by ``signer``; bound to
    ``context`` (say, ``job/from/to``)."""
    ephemeral = ec.generate_private_key(recipient.curve)
    nonce = os.urandom(12)
    box = AESGCM(_aes_key(ephemeral.exchange(ec.ECDH(), recipient), context.encode()))
    body = {
        "context": context,
        "ephemeral": b64encode(ephemeral.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)).decode(),
        "nonce": b64encode(nonce).decode(),
        "sealed": b64encode(box.encrypt(nonce, secret, context.encode())).decode(),
    }
    signed = json.dumps(body, sort_keys=True).encode()
    signature = signer.sign(signed, ec.ECDSA(hashes.SHA256()))
    return json.dumps({"body": b64encode(signed).decode(), "signature": b64encode(signature).decode()}).encode()


def unseal(blob: bytes, recipient: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePublicKey,
           context: str) -> bytes:
    """The secret in ``blob``, when ``signer`` signed it for ``context`` and ``recipient`` can open
    it; anything else is a :class:`SecurityError` in one line."""
    try:
        outer = json.loads(blob)
        signed, signature = b64decode(outer["body"]), b64decode(outer["signature"])
    except (ValueError, KeyError, TypeError):
        raise SecurityError("a sealed job key that is not one: unreadable envelope") from None
    try:
        signer.verify(signature, signed, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise SecurityError("a sealed job key not signed by the peer CA this cluster trusts: refused") from None
    body = json.loads(signed)
    if body.get("context") != context:
        raise SecurityError(f"a sealed job key for {body.get('context')!r}, not {context!r}: refused")
    try:
        ephemeral = ec.EllipticCurvePublicKey.from_encoded_point(recipient.curve, b64decode(body["ephemeral"]))
        box = AESGCM(_aes_key(recipient.exchange(ec.ECDH(), ephemeral), context.encode()))
        return box.decrypt(b64decode(body["nonce"]), b64decode(body["sealed"]), context.encode())
    except (ValueError, KeyError, InvalidTag):
        raise SecurityError("a sealed job key this cluster's CA cannot open: refused") from None
