"""A secret sealed to a cluster's CA, signed by another's: how the job key crosses to a peer.

The job key (``security.keys``) must be the same file on every host of a job, and no one should
carry it by hand. The cluster that holds it seals it to each peer cluster's CA certificate
(ECIES on the CA's P-256 key: an ephemeral ECDH key, HKDF-SHA256, AES-256-GCM) and signs the
result with its own CA key (ECDSA-SHA256); the sealed copy travels on a federated queue
(``stack.provision`` ``key_flows``). Only the peer's CA key opens it, and the peer accepts it
only when the signature is the CA's it already trusts (``certs import-ca``). The context (job
and clusters) is bound into both, so a sealed key cannot be replayed for another job.
"""

from __future__ import annotations

import json
import os
from base64 import b64decode, b64encode

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from nebula_mq.errors import SecurityError

_INFO = b"nebula-mq sealed job key v1"


def _aes_key(shared: bytes, context: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=context, info=_INFO).derive(shared)


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
