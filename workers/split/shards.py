"""How N head ranks and M tail ranks share each micro-batch, and which flow carries what.

Micro-batch ``s`` is the global batch of ``B`` samples that one head and one tail
would train on. Head rank ``i`` takes shard ``i`` (``B / N`` rows), cuts it into
``M`` pieces and sends piece ``j`` to tail rank ``j`` on ``activations-<j>``. Tail
rank ``j`` trains on the ``N`` pieces of step ``s`` concatenated in head order
(``B / M`` rows) and replies to head rank ``i`` on ``reply-<head i>`` with the
gradient of piece ``i``. Every piece has exactly one sender and one receiver.

Why one flow per receiving rank and not competing consumers on one queue:

* a piece can only be applied by the rank that trains on it; a redelivery after a
  WAN drop or a restart goes back to the rank whose checkpoint covers it, whereas
  competing consumers hand a redelivered message to whichever rank asks next;
* each (head rank, tail rank) pair is one ordered stream, with its own dedupe
  counter and its own compression state (AQ-SGD references and error-feedback
  residuals are per sample: both ends of a pair always agree on them);
* every rank of a side trains on the same number of samples every step, which
  the mean of the gradient all-reduce assumes.

The cost is ``N x M`` streams over ``N + M`` queues; the bytes per sample do not
change with the number of ranks.

**Same model as 1 x 1.** The tail's loss is a mean over its ``B / M`` rows, so
``d(global mean loss) / d(activation) = d(tail loss) / d(activation) / M``: the
tail scales its replies by ``1 / M``. Tail ranks average their weight gradients
(the mean of ``M`` equal-size means is the global mean); head ranks sum theirs
(each holds its shard's exact part of the global gradient). Clipping and the
optimizer then see the 1 x 1 gradient on every rank. Exact for losses that are a
mean over samples; a loss averaged over tokens weights each rank's tokens by its
own count. Dropout draws differ from 1 x 1 (each rank seeds its own shard).
"""

from __future__ import annotations

from dataclasses import dataclass

from nebula_mq.errors import DataError


def piece(rows: int, pieces: int, index: int) -> slice:
    """Piece ``index`` of ``pieces`` equal pieces of ``rows`` rows, cut along the first axis; the
    caller checks that they divide, as it knows which setting to name when they do not."""
    size = rows // pieces
    return slice(index * size, (index + 1) * size)


def rank_id(base: str, rank: int) -> str:
    """Worker id of rank ``rank`` of a side whose rank 0 is ``base`` (rank 0 keeps the
    1 x 1 id, so a job's checkpoints stay where they were)."""
    return base if rank == 0 else f"{base}-r{rank}"


@dataclass(frozen=True)
class Ranks:
    heads: int = 1
    tails: int = 1

    def check_batch(self, rows: int) -> None:
        if rows % (self.heads * self.tails):
            raise DataError(f"a micro-batch of {rows} samples cannot be cut into {self.heads} x {self.tails} "
                            f"equal pieces: make the batch a multiple of {self.heads * self.tails}")

    def shard(self, rows: int, head: int) -> slice:
        """Head rank ``head``'s rows of a global micro-batch of ``rows``."""
        self.check_batch(rows)
        return piece(rows, self.heads, head)
