"""``bench wan --codecs auto``: each WAN row trains with the chains ``auto`` picks for its link.

Inside one cluster nothing is compressed, so with ``--codecs auto`` the in-cluster row runs
uncompressed (``none`` / ``none``). Its metrics give what the rule of ``nebula_mq.study.auto``
needs: the slower side's compute seconds per step in the steady state (the step the row's rate
implies after its warm-up, times that side's compute share: the totals would count the first
steps' imports, and a median step would leave out the batches of long sentences, which take up
to ten times the typical step on real data), and the
size of an uncompressed activation (the head's published bytes per step), from which the typical
[B, S, H] follows. The picks are made once, from the first repeat's in-cluster row, so every
repeat trains the same chains.

ABNet jobs choose among all of ``auto``'s candidates; a split job among those without feedback
(delta activations and gradient error feedback are ABNet's: they keep state per sample).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nebula_mq.bench.runs import published_bytes
from nebula_mq.study import auto
from nebula_mq.study.rows import StudyRow

UNCOMPRESSED = StudyRow("none", "none", origin="auto")


@dataclass(frozen=True)
class Profile:
    """What the in-cluster (uncompressed) row measured."""

    compute_s: float  # the slower side's compute seconds per step
    forward_bytes: float  # the head's published bytes per step (activations)
    backward_bytes: float  # the tail's published bytes per step (gradients)
    shape: tuple[int, int, int]  # a typical activation, [B, S, H]

    def wire_factor(self, rate_mbit: float) -> float:
        """Uncompressed wire time of a step (the slower direction) over its compute: the paper's
        regime is about 4."""
        return max(self.forward_bytes, self.backward_bytes) * 8 / (rate_mbit * 1e6) / self.compute_s

    def rate_for(self, wire_factor: float) -> float:
        """The rate in Mbit/s at which :meth:`wire_factor` is ``wire_factor``."""
        return max(self.forward_bytes, self.backward_bytes) * 8 / (wire_factor * self.compute_s) / 1e6


def row_codecs(settings: Any, row: StudyRow) -> dict[str, str]:
    """``NEBULA__`` overrides that make a job train with ``row``'s chains, from its first step."""
    env = {"NEBULA__CODEC__FORWARD": row.forward, "NEBULA__CODEC__BACKWARD": row.backward,
           "NEBULA__CODEC__COMPRESS_FROM_STEP": "0"}
    if settings.job.scenario == "abnet":
        env["NEBULA__ABNET__FORWARD_FEEDBACK"] = row.forward_feedback
        env["NEBULA__ABNET__BACKWARD_FEEDBACK"] = row.backward_feedback
    return env


def profile(settings: Any, run_dir: Path, steps: int, heads: list[str], tails: list[str],
            measured: dict[str, Any]) -> Profile:
    """The in-cluster row's :class:`Profile`: ``measured`` is its row (samples/s after the
    warm-up, samples, compute shares), the bytes come from its workers' metrics."""
    from nebula_mq.errors import WorkerError

    shares = measured["compute_share"].values()
    batch = max(1, round(measured["samples"] / steps))  # the global batch, as trained
    compute = batch / measured["samples_per_s"] * max(shares, default=0.0) if measured["samples_per_s"] else 0.0
    forward = sum(published_bytes(run_dir, w) for w in heads) / steps
    backward = sum(published_bytes(run_dir, w) for w in tails) / steps
    if compute <= 0 or forward <= 0:
        raise WorkerError(f"the in-cluster row left no compute time or activation bytes in {run_dir / 'metrics'}: "
                          "neither auto's chains nor a wire factor like 4x can be set from it")
    if settings.job.scenario == "abnet":
        from nebula_mq.models import abnet_config
        from workers.abnet.job import load_job  # paddle-free: the launcher reads it too

        shape = auto.activation_shape(forward, batch, abnet_config.preset(load_job(settings).preset).encoder.hidden)
    else:  # the user's model: its width is unknown, and only the element count sets the chains' cost
        shape = (batch, 1, max(1, round(forward / 4 / batch)))
    return Profile(compute, forward, backward, shape)


def pick(settings: Any, found: Profile, rate_mbit: float) -> auto.Choice:
    """The chains ``auto`` picks for a ``rate_mbit`` link, by the study's rule."""
    candidates = auto.DEFAULT_CANDIDATES
    if settings.job.scenario != "abnet":
        candidates = tuple(c for c in candidates if c.forward_feedback == c.backward_feedback == "none")
    return auto.pick(auto.LinkProfile(rate_mbit, found.compute_s, found.shape), candidates)


class AutoCodecs:
    """The chains of each row under ``--codecs auto``: uncompressed in one cluster, ``auto``'s
    pick for each WAN rate, chosen once from the first in-cluster row (:meth:`learn`)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.found: Profile | None = None
        self.picks: dict[float, auto.Choice] = {}

    def choice(self, rate_mbit: float | None) -> StudyRow:
        if rate_mbit is None:
            return UNCOMPRESSED
        if self.found is None:
            raise RuntimeError("the in-cluster row runs before any WAN row")
        if rate_mbit not in self.picks:
            self.picks[rate_mbit] = pick(self.settings, self.found, rate_mbit)
        return self.picks[rate_mbit].row

    def env(self, rate_mbit: float | None) -> dict[str, str]:
        return row_codecs(self.settings, self.choice(rate_mbit))

    def learn(self, found: Profile) -> None:
        """The first in-cluster row's profile: every pick is made from it."""
        if self.found is None:
            self.found = found

    def notes(self) -> list[str]:
        found = self.found
        if found is None:
            return []
        lines = [f"auto: in one cluster (uncompressed) {found.compute_s * 1000:.0f} ms of compute a step on the "
                 f"slower side, {found.forward_bytes / 1e3:.0f} kB of activations and {found.backward_bytes / 1e3:.0f} "
                 f"kB of gradients; activation {list(found.shape)}"]
        for rate, c in sorted(self.picks.items()):
            lines.append(f"auto at {rate:g} Mbit/s: {c.row.chain} (uncompressed wire {found.wire_factor(rate):.1f}x "
                         f"compute; estimated wire {c.wire_s * 1000:.0f} ms, codec {c.codec_s * 1000:.1f} ms, "
                         f"step {c.step_s * 1000:.0f} ms)")
        return lines
