"""Fetch Debian packages into a cache without installing them.

``apt-get download`` needs no root and touches no system state; ``dpkg-deb -x``
unpacks into a private tree. Both are optional: a machine without apt or
without network gets ``None`` back and a warning, and the build goes on with
what it has (earlier downloads stay cached).
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_TIMEOUT_S = 300


def unpacked_root(cache_dir: Path) -> Path:
    """Where :func:`fetch` unpacks packages (a fake ``/``: ``usr/share/...`` below it)."""
    return cache_dir / "root"


def fetch(packages: list[str], cache_dir: Path, *, download: bool = True) -> dict[str, bool]:
    """Make each package's files available under :func:`unpacked_root`.

    Returns package → available. A package already unpacked is not fetched again;
    with ``download=False`` only the cache is used.
    """
    root = unpacked_root(cache_dir)
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    status: dict[str, bool] = {}
    for package in packages:
        marker = cache_dir / f"{package}.unpacked"
        if marker.exists():
            status[package] = True
            continue
        deb = _find_deb(debs, package)
        if deb is None and download:
            deb = _download(package, debs)
        if deb is None:
            status[package] = False
            continue
        status[package] = _unpack(deb, root)
        if status[package]:
            marker.write_text(deb.name + "\n")
    return status


def _find_deb(debs: Path, package: str) -> Path | None:
    found = sorted(glob.glob(str(debs / f"{glob.escape(package)}_*.deb")))
    return Path(found[-1]) if found else None


def _download(package: str, debs: Path) -> Path | None:
    if not _run(["apt-get", "download", "-q", package], "download", package=package, cwd=debs):
        return None
    return _find_deb(debs, package)


def _unpack(deb: Path, root: Path) -> bool:
    return _run(["dpkg-deb", "-x", str(deb), str(root)], "unpack", deb=str(deb))


def _run(command: list[str], what: str, cwd: Path | None = None, **about: str) -> bool:
    """Run ``command``; a missing tool, a timeout or a failure is a warning (``data.<what>_...``)."""
    if shutil.which(command[0]) is None:
        log.warning(f"data.{what}_skipped", **about, why=f"{command[0]} not found")
        return False
    try:
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning(f"data.{what}_failed", **about, why=str(exc))
        return False
    if proc.returncode != 0:
        log.warning(f"data.{what}_failed", **about, why=proc.stderr.strip()[-300:])
        return False
    return True
