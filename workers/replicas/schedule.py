"""When a replica syncs what: DiLoCo's rounds, or Streaming DiLoCo's fragments with overlap.

The model's parameters are cut into ``fragments`` (P) groups, contiguous in the model's order
and balanced by size (:func:`partition`). Every ``H / P`` inner steps one fragment is synced,
the fragments in turn, so each is synced every ``H`` inner steps and the wire carries 1/P of
the model at a time (Streaming DiLoCo, Douillard et al. 2025, sequential pattern). A **sync
event** ``s`` (the driver's step ``s``) is fragment ``s mod P``'s outer step ``s // P``:

* its pseudo-gradient leaves after inner step ``send_at(s) = (s + 1) * H / P``;
* with ``overlap`` (τ) > 0, the replica trains τ more inner steps before it waits for the
  other clusters' pseudo-gradients of the event (``apply_at(s)``), so the wire's round trip
  hides behind compute; the outer step lands τ steps late, and the fragment's local weights
  become ``α * local + (1 - α) * outer`` (α = ``mixing``) instead of the outer weights.

With P = 1 and τ = 0 this is DiLoCo: event ``s`` is round ``s``, every parameter synced after
every ``H`` inner steps and the replica taking the outer weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nebula_mq.errors import ConfigError


@dataclass(frozen=True)
class SyncSchedule:
    """The ``events`` sync events of a job (see the module docstring)."""

    inner_steps: int  # H
    fragments: int  # P; divides H
    overlap: int  # τ, 0 <= τ <= H / P
    events: int  # [job] steps: the driver's steps, P per outer round

    @property
    def stride(self) -> int:
        """Inner steps between two sync events."""
        return self.inner_steps // self.fragments

    @property
    def inner_total(self) -> int:
        return self.events * self.stride

    def fragment(self, event: int) -> int:
        return event % self.fragments

    def outer_round(self, event: int) -> int:
        """How many outer steps the event's fragment has taken before it."""
        return event // self.fragments

    def send_at(self, event: int) -> int:
        """Inner steps done when the event's pseudo-gradient leaves."""
        return (event + 1) * self.stride

    def apply_at(self, event: int) -> int:
        """Inner steps done when the event's outer step is applied (-1: before the first)."""
        if event < 0:
            return 0
        return min(self.send_at(event) + self.overlap, self.inner_total)


def partition(sizes: Mapping[str, int], parts: int, source: str = "<job>") -> tuple[tuple[str, ...], ...]:
    """``sizes``' names (in their order) in ``parts`` contiguous non-empty groups, each cut
    where the running size passes the next ``1/parts`` of the total; more parts than names is
    a ConfigError naming ``source``."""
    names = list(sizes)
    if not 1 <= parts <= len(names):
        raise ConfigError(source, "replicas.fragments", f"1 to {len(names)} (the model's parameter tensors)", parts)
    total = sum(sizes.values())
    groups: list[list[str]] = [[]]
    done = 0
    for i, name in enumerate(names):
        k = len(groups) - 1
        left = len(names) - i
        if groups[k] and k < parts - 1 and (done >= (k + 1) * total / parts or left <= parts - 1 - k):
            groups.append([])
        groups[-1].append(name)
        done += sizes[name]
    return tuple(tuple(g) for g in groups)
