"""The language-identification example (examples/split_langid) on the GPU machine, which has no
gettext catalogues: the example's splits, made on a machine that has them, travel as one file.

    python tests/gpu/langid_carried.py save        # here: the example's LangData -> .langid/langid.npz
    (device call: carry [".langid", ...]; the job files tests/gpu/langid-*.toml name the builders below)

``build_head``, ``build_tail`` and ``build_replica`` are the example's own builders given that
data, so the GPU runs train exactly the example's model on exactly its strings.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "split_langid"))

import langid_data  # noqa: E402  (the example's modules sit in its folder)
import langid_model  # noqa: E402
from langid_data import LangData  # noqa: E402

FIELDS = ("train_bytes", "train_labels", "test_bytes", "test_labels")


def path() -> Path:
    return Path(os.environ.get("NEBULA_LANGID_NPZ", REPO / ".langid" / "langid.npz"))


def save(to: Path) -> None:
    data = langid_data.dataset()
    to.parent.mkdir(parents=True, exist_ok=True)
    # Tokens are bytes + 1 (0 is padding), up to 256: uint16 keeps them and the file small.
    arrays = {f: getattr(data, f) for f in FIELDS}
    assert all(a.min() >= 0 and a.max() < 2**16 for a in arrays.values())
    np.savez_compressed(to, languages=np.array(data.languages),
                        **{f: a.astype(np.uint16) for f, a in arrays.items()})
    print(f"{to}: {len(data.train_labels)} training and {len(data.test_labels)} held-out strings, "
          f"{', '.join(data.languages)}; {to.stat().st_size / 1e6:.1f} MB")


@lru_cache(maxsize=1)
def carried() -> LangData:
    with np.load(path()) as z:
        return LangData(tuple(str(v) for v in z["languages"]),
                        *(z[f].astype(np.int64) for f in FIELDS))


def build_head(settings: Any) -> Any:
    return langid_model.build_head(settings, carried())


def build_tail(settings: Any) -> Any:
    return langid_model.build_tail(settings, carried())


def build_replica(settings: Any, index: int) -> Any:
    import langid_replicas
    return langid_replicas.build_replica(settings, index, carried())


if __name__ == "__main__":
    if sys.argv[1:] != ["save"]:
        sys.exit("usage: python tests/gpu/langid_carried.py save")
    save(path())
