"""A job key sealed to one cluster's CA and signed by another's (``security.keys``): only the
recipient opens it, only from the signer it trusts, only for the job and clusters it was meant for."""

from __future__ import annotations

import json
from base64 import b64decode, b64encode

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from nebula_mq.errors import SecurityError
from nebula_mq.security.keys import seal, unseal

SECRET = b'{"job": "j", "keys": [...]}'
CONTEXT = "j/cluster-a/cluster-b"


@pytest.fixture
def keys() -> dict[str, ec.EllipticCurvePrivateKey]:
    return {name: ec.generate_private_key(ec.SECP256R1()) for name in ("a", "b", "mallory")}


def test_the_recipient_opens_what_the_trusted_signer_sealed(keys: dict[str, ec.EllipticCurvePrivateKey]) -> None:
    blob = seal(SECRET, keys["b"].public_key(), keys["a"], CONTEXT)
    assert SECRET not in blob
    assert unseal(blob, keys["b"], keys["a"].public_key(), CONTEXT) == SECRET


@pytest.mark.parametrize("case", ["other recipient", "other signer", "other context", "tampered", "garbage"])
def test_anything_else_is_refused_in_one_line(keys: dict[str, ec.EllipticCurvePrivateKey], case: str) -> None:
    blob = seal(SECRET, keys["b"].public_key(), keys["a"], CONTEXT)
    recipient, signer, context = keys["b"], keys["a"].public_key(), CONTEXT
    if case == "other recipient":
        recipient = keys["mallory"]
    elif case == "other signer":
        blob = seal(SECRET, keys["b"].public_key(), keys["mallory"], CONTEXT)
    elif case == "other context":
        context = "j2/cluster-a/cluster-b"
    elif case == "tampered":
        outer = json.loads(blob)
        body = bytearray(b64decode(outer["body"]))
        body[-5] ^= 1
        blob = json.dumps({**outer, "body": b64encode(bytes(body)).decode()}).encode()
    else:
        blob = b"not a sealed key"
    with pytest.raises(SecurityError) as info:
        unseal(blob, recipient, signer, context)
    message = str(info.value)
    assert "\n" not in message and ("refused" in message or "unreadable" in message), message
