"""The data-access interface (paper section 2.4): owners grant jobs access to named datasets.

A *tenant* is an account: it owns jobs (each with its own vhost, queues and
certificates) and datasets. A dataset lives in ``ROOT/datasets/<owner>/<name>``.
A job reads only through :meth:`DataAccess.open_dataset`, which returns the
dataset's path when

* the job's tenant owns the dataset, or
* the owner's *grants file* ``ROOT/grants/<owner>.json`` lists ``(job, name)``
  and carries a valid Ed25519 signature by the owner's key
  (``ROOT/owners/<owner>.pub``; the private key stays with the owner, 0600).

Otherwise it raises :class:`~nebula_mq.errors.DataAccessDenied`. Every grant,
revocation, access and refusal is audited. Ed25519 fits here (unlike for
tensors): grants are tiny, and whoever runs ``open_dataset`` must be able to
check them without being able to write them, which a shared HMAC key could not
give. A grants file edited by anyone but the owner fails the signature and
grants nothing.

What this does not do: stop a process that ignores the API from reading the
files. Deployments run each tenant's workers as their own Unix user (or
container) with the datasets directory mode 0700 per owner; see docs/security.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from nebula_mq.errors import DataAccessDenied, SecurityError
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.pem import write_private
from nebula_mq.atomic import write_json_atomic

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def _check(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise SecurityError(f"{what} must match {_NAME.pattern}, got {name!r}")
    return name


@dataclass(frozen=True)
class Grant:
    job: str
    dataset: str
    granted_at: float


def _payload(owner: str, grants: list[Grant]) -> bytes:
    body = {"owner": owner, "grants": sorted([[g.job, g.dataset, g.granted_at] for g in grants])}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class DataOwner:
    """A tenant acting as data owner: holds the signing key, publishes datasets and grants."""

    def __init__(self, root: str | os.PathLike[str], owner: str, audit: AuditLog) -> None:
        self.root = Path(root)
        self.owner = _check(owner, "owner")
        self.audit = audit
        self.key_file = self.root / "owners" / f"{owner}.key"
        self.pub_file = self.root / "owners" / f"{owner}.pub"
        self.grants_file = self.root / "grants" / f"{owner}.json"

    def ensure_key(self) -> None:
        if self.key_file.exists():
            return
        key = Ed25519PrivateKey.generate()
        write_private(self.key_file, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
        self.pub_file.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))

    def dataset_dir(self, name: str) -> Path:
        """Where the owner puts dataset ``name`` (created with mode 0700)."""
        d = self.root / "datasets" / self.owner / _check(name, "dataset")
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    def grants(self) -> list[Grant]:
        return load_grants(self.root, self.owner)

    def grant(self, job: str, name: str) -> Grant:
        """Let ``job`` read dataset ``name``, which must already be under this owner's datasets:
        a mistyped root or dataset is refused, never a new root, key or grant for nothing."""
        g = Grant(_check(job, "job"), _check(name, "dataset"), round(time.time(), 3))
        if not (self.root / "datasets").is_dir():
            raise DataAccessDenied(f"no data root at {str(self.root)!r} (it has no datasets/ folder)")
        if not (self.root / "datasets" / self.owner / name).is_dir():
            raise DataAccessDenied(f"{self.owner} has no dataset {name!r} under "
                                   f"{str(self.root / 'datasets' / self.owner)!r}")
        kept = [x for x in self.grants() if (x.job, x.dataset) != (job, name)]
        self._write([*kept, g])
        self.audit.record("data_grant", owner=self.owner, job=job, dataset=name)
        return g

    def revoke(self, job: str, name: str) -> None:
        self._write([x for x in self.grants() if (x.job, x.dataset) != (job, name)])
        self.audit.record("data_revoke", owner=self.owner, job=job, dataset=name)

    def _write(self, grants: list[Grant]) -> None:
        self.ensure_key()
        key = serialization.load_pem_private_key(self.key_file.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SecurityError(f"{self.key_file}: not an Ed25519 key")
        payload = _payload(self.owner, grants)
        doc = {"payload": json.loads(payload), "signature": key.sign(payload).hex()}
        write_json_atomic(self.grants_file, doc, indent=1)


def load_grants(root: str | os.PathLike[str], owner: str) -> list[Grant]:
    """The owner's grants, after checking the owner's signature; [] when there is no file."""
    root = Path(root)
    path = root / "grants" / f"{_check(owner, 'owner')}.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise DataAccessDenied(f"{path}: unreadable grants file ({exc})") from None
    try:
        pub = serialization.load_pem_public_key((root / "owners" / f"{owner}.pub").read_bytes())
        payload = json.dumps(doc["payload"], sort_keys=True, separators=(",", ":")).encode()
        if not isinstance(pub, Ed25519PublicKey):
            raise ValueError("owner key is not Ed25519")
        pub.verify(bytes.fromhex(doc["signature"]), payload)
        if doc["payload"]["owner"] != owner:
            raise ValueError("grants file of another owner")
        return [Grant(str(j), str(d), float(t)) for j, d, t in doc["payload"]["grants"]]
    except InvalidSignature:
        raise DataAccessDenied(f"{path}: grants file signature does not verify (edited by someone "
                               f"other than {owner!r})") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataAccessDenied(f"{path}: invalid grants file ({exc})") from None


class DataAccess:
    """What a job's workers call to read data; every decision is audited."""

    def __init__(self, root: str | os.PathLike[str], audit: AuditLog) -> None:
        self.root = Path(root)
        self.audit = audit

    def open_dataset(self, job: str, tenant: str, dataset: str) -> Path:
        """Path of ``dataset`` (``owner/name``) for ``job`` of ``tenant``, or DataAccessDenied."""
        owner, sep, name = dataset.partition("/")
        try:
            if not sep:
                raise DataAccessDenied(f"dataset must be 'owner/name', got {dataset!r}")
            _check(owner, "owner"), _check(name, "dataset"), _check(job, "job")
            if owner != tenant and not any((g.job, g.dataset) == (job, name) for g in load_grants(self.root, owner)):
                raise DataAccessDenied(f"job {job!r} of tenant {tenant!r} has no grant from {owner!r} "
                                       f"for dataset {name!r}")
            path = self.root / "datasets" / owner / name
            if not path.is_dir():
                raise DataAccessDenied(f"dataset {dataset!r} does not exist")
        except SecurityError as exc:
            self.audit.record("data_access_denied", job=job, tenant=tenant, dataset=dataset, detail=str(exc))
            raise DataAccessDenied(str(exc)) from None
        self.audit.record("data_access", job=job, tenant=tenant, dataset=dataset, own=owner == tenant)
        return path
