"""Reading ``.npz`` files safely from several threads.

numpy parses every array header with ``ast.literal_eval``. On CPython 3.11,
building AST objects on two threads at once can fail with ``SystemError: AST
constructor recursion depth mismatch`` (python/cpython gh-106905): the
constructor's recursion counter is per interpreter, not per thread. Workers
restore checkpoints from their own threads (the in-process test runner, the
evaluation thread), so every read of a numpy file goes through one lock here.
Reads are small and rare (start-up, resume); the lock costs nothing measurable.
"""

from __future__ import annotations

import threading
from os import PathLike

import numpy as np

# Held while numpy parses headers (it builds ASTs); see the module docstring.
_HEADER_LOCK = threading.Lock()


def load_npz(path: str | PathLike[str]) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, read into memory (no pickles).

    Raises what ``np.load`` raises (OSError, ValueError, zipfile.BadZipFile);
    callers translate it into their own typed error.
    """
    with _HEADER_LOCK, np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}

