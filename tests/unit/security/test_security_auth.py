"""Message authentication: HMAC tags over the signed region, replay window, key rotation, AES-GCM sealing."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nebula_mq.codecs import parse_codec
from nebula_mq.errors import AuthenticationFailed, ReplayedMessage, SecurityError, WireError
from nebula_mq.security.audit import AuditLog, verify_chain
from nebula_mq.security.auth import TAG_BYTES, MessageAuth
from nebula_mq.security.keys import KeyRing, ensure_job_key, new_incarnation, retire_old_keys, rotate_job_key
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors

MAX = 1 << 26


def _env(job: str = "j1", step: int = 3, x: np.ndarray | None = None) -> Envelope:
    x = np.arange(64, dtype=np.float32).reshape(8, 8) if x is None else x
    return Envelope(job, "activations", step, 5, 5, "enc-0", pack_tensors({"x": x}, parse_codec("none")),
                    {"loss": 1.5})


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return ensure_job_key(tmp_path / "keys" / "job.key", "j1")


def _roundtrip(auth: MessageAuth, env: Envelope) -> Envelope:
    return decode_envelope(encode_envelope(env, signer=auth.signer()), max_bytes=MAX)


def test_signed_envelope_verifies_and_carries_its_send_time(ring: KeyRing) -> None:
    auth = MessageAuth(ring)
    before = int(time.time() * 1000)
    env = _roundtrip(auth, _env())
    info = auth.verify(env)
    assert len(env.auth_tag) == TAG_BYTES
    assert info.key_id == ring.current.key_id and before <= info.sent_at_ms <= time.time() * 1000


def test_key_file_is_private_and_loading_refuses_a_readable_one(tmp_path: Path) -> None:
    path = tmp_path / "job.key"
    ring = ensure_job_key(path, "j1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_job_key(path, "j1") == ring  # idempotent
    with pytest.raises(SecurityError, match="key ring of job 'j1', not 'j2'"):
        ensure_job_key(path, "j2")
    os.chmod(path, 0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        KeyRing.load(path)


def test_unsigned_and_malformed_tags_are_refused(ring: KeyRing) -> None:
    auth = MessageAuth(ring)
    plain = decode_envelope(encode_envelope(_env()), max_bytes=MAX)
    with pytest.raises(AuthenticationFailed, match="no authentication tag"):
        auth.verify(plain)
    short = decode_envelope(encode_envelope(dataclasses.replace(_env(), auth_tag=b"x" * 10)), max_bytes=MAX)
    with pytest.raises(AuthenticationFailed, match="10 bytes"):
        auth.verify(short)


def test_another_jobs_key_is_refused(ring: KeyRing, tmp_path: Path) -> None:
    other = ensure_job_key(tmp_path / "other.key", "j1")  # same job id, different secret
    env = _roundtrip(MessageAuth(other), _env())
    with pytest.raises(AuthenticationFailed, match="not a key of job"):
        MessageAuth(ring).verify(env)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, 1000), flip=st.integers(0, 63), producer=st.sampled_from(["enc-0", "enc-1", "dec-0"]))
def test_altered_messages_fail_with_the_original_tag(ring: KeyRing, step: int, flip: int, producer: str) -> None:
    """Reusing a genuine tag on any other content (ids, producer, one tensor value) fails."""
    auth = MessageAuth(ring)
    genuine = _roundtrip(auth, _env())
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    x.reshape(-1)[flip] += 1
    for forged in (dataclasses.replace(_env(step=step + 4), auth_tag=genuine.auth_tag),
                   dataclasses.replace(_env(x=x), auth_tag=genuine.auth_tag),
                   dataclasses.replace(_env(), producer=producer + "x", auth_tag=genuine.auth_tag)):
        received = decode_envelope(encode_envelope(forged), max_bytes=MAX)  # checksum recomputed: wire accepts it
        with pytest.raises(AuthenticationFailed, match="does not match"):
            auth.verify(received)


def test_forged_tag_bytes_fail(ring: KeyRing) -> None:
    auth = MessageAuth(ring)
    env = _roundtrip(auth, _env())
    tag = bytearray(env.auth_tag)
    tag[-1] ^= 1
    with pytest.raises(AuthenticationFailed):
        auth.verify(decode_envelope(encode_envelope(dataclasses.replace(_env(), auth_tag=bytes(tag))), max_bytes=MAX))
    tag = bytearray(env.auth_tag)
    tag[12] ^= 1  # the signed send time: moving it breaks the MAC too
    with pytest.raises(AuthenticationFailed):
        auth.verify(decode_envelope(encode_envelope(dataclasses.replace(_env(), auth_tag=bytes(tag))), max_bytes=MAX))


def test_replay_rules_window_incarnation_and_future(ring: KeyRing, tmp_path: Path) -> None:
    # This incarnation began an hour ago, so only the window decides for the first three.
    auth = MessageAuth(dataclasses.replace(ring, incarnation_ms=ring.incarnation_ms - 3_600_000),
                       window_s=60, max_skew_s=5)
    now = time.time()
    old = decode_envelope(encode_envelope(_env(), signer=auth.signer(int((now - 61) * 1000))), max_bytes=MAX)
    fresh = decode_envelope(encode_envelope(_env(), signer=auth.signer(int((now - 59) * 1000))), max_bytes=MAX)
    future = decode_envelope(encode_envelope(_env(), signer=auth.signer(int((now + 10) * 1000))), max_bytes=MAX)
    assert auth.verify(fresh, now=now)
    with pytest.raises(ReplayedMessage, match="outside the 60s window"):
        auth.verify(old, now=now)
    with pytest.raises(ReplayedMessage, match="in the future"):
        auth.verify(future, now=now)
    before = decode_envelope(encode_envelope(_env(), signer=auth.signer(ring.incarnation_ms - 1)), max_bytes=MAX)
    with pytest.raises(ReplayedMessage, match="before this job incarnation"):
        MessageAuth(ring).verify(before)
    assert issubclass(ReplayedMessage, WireError) and ReplayedMessage.reason == "replayed"


def test_rotation_keeps_old_messages_valid_until_retired_and_new_incarnation_refuses_all(tmp_path: Path) -> None:
    path = tmp_path / "job.key"
    ring = ensure_job_key(path, "j1")
    queued = _roundtrip(MessageAuth(ring), _env())
    rotated = rotate_job_key(path)
    assert rotated.current != ring.current and len(rotated.keys) == 2
    assert MessageAuth(rotated).verify(queued).key_id == ring.current.key_id
    assert MessageAuth(rotated).verify(_roundtrip(MessageAuth(rotated), _env())).key_id == rotated.current.key_id
    with pytest.raises(AuthenticationFailed):
        MessageAuth(retire_old_keys(path)).verify(queued)
    with pytest.raises(AuthenticationFailed):
        MessageAuth(new_incarnation(path, "j1")).verify(_roundtrip(MessageAuth(rotated), _env()))


def test_rejections_are_audited(ring: KeyRing, tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    auth = MessageAuth(ring, audit=audit, consumer="dec-0")
    genuine = _roundtrip(auth, _env())
    forged = decode_envelope(encode_envelope(dataclasses.replace(_env(step=9), auth_tag=genuine.auth_tag)),
                             max_bytes=MAX)
    with pytest.raises(AuthenticationFailed):
        auth.verify(forged)
    (rec,) = list(audit.records())
    assert rec["event"] == "message_rejected" and rec["reason"] == "bad_tag"
    assert rec["message_id"] == forged.message_id and rec["consumer"] == "dec-0" and rec["producer"] == "enc-0"
    assert verify_chain(audit.path).records == 1


def test_sealed_frames_hide_tensors_and_detect_tampering(ring: KeyRing) -> None:
    auth = MessageAuth(ring)
    x = np.full((64, 64), 1234.5, dtype=np.float32)
    frame = encode_envelope(_env(x=x), signer=auth.signer())
    sealed, again = auth.seal(frame), auth.seal(frame)
    assert x.tobytes()[:64] in frame and x.tobytes()[:64] not in sealed
    assert sealed[:4] == b"NBSE" and sealed[16:28] != again[16:28]  # a fresh random nonce per message
    opened = auth.open(sealed)
    assert opened == frame
    env = decode_envelope(opened, max_bytes=MAX)
    auth.verify(env)
    tampered = bytearray(sealed)
    tampered[len(tampered) // 2] ^= 0x80
    with pytest.raises(AuthenticationFailed, match="altered"):
        auth.open(bytes(tampered))
    with pytest.raises(AuthenticationFailed, match="not sealed"):
        auth.open(frame)
    header = bytearray(sealed)
    header[8] ^= 1  # the key id (associated data)
    with pytest.raises(AuthenticationFailed):
        auth.open(bytes(header))
