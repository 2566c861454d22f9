"""A gloo group whose ranks run on several hosts is restarted by every host's supervisor.

A group's ranks must stop and start together: a restarted rank cannot join the rendezvous that
its old peers still hold, and a peer waiting for messages rather than in a collective never
notices that a rank died. On one host the supervisor kills and restarts the whole group. Across
hosts (``nebula-mq up --ranks``), each supervisor owns only its host's ranks; the hosts of a
cluster share the job's run directory, so a supervisor that restarts its ranks of a group bumps
the group's epoch there (``<run_dir>/groups/<group>.epoch``), and every other supervisor with
ranks in that group, seeing the epoch move, restarts its own.
"""

from __future__ import annotations

from pathlib import Path

from nebula_mq.atomic import write_atomic


class GroupEpochs:
    """The restart epochs of a job's groups, as this supervisor last saw them."""

    def __init__(self, run_dir: Path, groups: set[str]) -> None:
        self.dir = run_dir / "groups"
        self.seen = {g: self.read(g) for g in groups}  # what came before this supervisor is not news

    def read(self, group: str) -> int:
        try:
            return int((self.dir / f"{group}.epoch").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def bump(self, group: str) -> None:
        """This supervisor restarts its ranks of ``group``: tell the others."""
        epoch = max(self.read(group), self.seen.get(group, 0)) + 1
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / f"{group}.epoch", f"{epoch}\n")
        self.seen[group] = epoch

    def moved(self) -> list[str]:
        """The groups another supervisor restarted since the last look."""
        moved = []
        for group, seen in self.seen.items():
            now = self.read(group)
            if now > seen:
                self.seen[group] = now
                moved.append(group)
        return moved
