"""The restart policy of ``nebula-mq run`` (``nebula_mq.launch.supervisor``), over a job that
records what it is asked to do instead of starting processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from nebula_mq.launch.supervisor import MAX_PAUSE_S, RestartPolicy


@dataclass
class RecordingJob:
    groups: dict[str, tuple[str, ...]]
    at: dict[str, int] = field(default_factory=dict)
    restarts: list[tuple[str, float]] = field(default_factory=list)

    def group_of(self, worker_id: str) -> tuple[str, ...]:
        return self.groups.get(worker_id, (worker_id,))

    def steps(self) -> dict[str, int]:
        return dict(self.at)

    def kill_and_restart(self, worker_id: str, pause_s: float = 0.0) -> tuple[str, ...]:
        self.restarts.append((worker_id, pause_s))
        return self.group_of(worker_id)


def test_a_dead_worker_is_restarted_with_a_pause_that_doubles_while_it_keeps_failing() -> None:
    job, said = RecordingJob({}, {"dec-0": 10}), []
    policy = RestartPolicy(budget=10, say=said.append)
    for step in (10, 12, 20, 31, 40, 50, 60):
        job.at["dec-0"] = step
        assert policy.restart(job, "dec-0", -9)
    assert [p for _, p in job.restarts] == [1, 2, 4, 8, 16, MAX_PAUSE_S, MAX_PAUSE_S]
    assert "worker dec-0 exited -9 at step 10: restarting dec-0 in 1 s (restart 1 of 10)" in said[0]


def test_a_rank_is_restarted_with_its_whole_group_from_the_groups_slowest_step() -> None:
    group = ("enc-0", "enc-0-r1")
    job, said = RecordingJob({w: group for w in group}, {"enc-0": 8, "enc-0-r1": 7}), []
    assert RestartPolicy(budget=3, say=said.append).restart(job, "enc-0-r1", 1)
    assert job.restarts == [("enc-0-r1", 1.0)]
    assert "at step 7: restarting enc-0-r1 (with its group: enc-0, enc-0-r1)" in said[0]


def test_a_failure_that_repeats_without_progress_or_past_the_budget_stops_the_job() -> None:
    job, said = RecordingJob({}, {"dec-0": 5, "enc-0": 5}), []
    policy = RestartPolicy(budget=2, say=said.append)
    assert policy.restart(job, "dec-0", 1)
    assert not policy.restart(job, "dec-0", 1)  # still at step 5: the same failure again
    assert "again without a step since its restart" in said[-1]
    assert policy.restart(job, "enc-0", -9)
    job.at["enc-0"] = 9
    assert not policy.restart(job, "enc-0", -9)  # progress, but the budget is spent
    assert "no restarts left (2 made)" in said[-1]
    assert len(job.restarts) == 2


def test_every_restart_is_recorded_in_the_faults_log_with_its_recovery_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    job = RecordingJob({}, {"dec-0": 5, "enc-0": 5})
    log = tmp_path / "faults.jsonl"
    policy = RestartPolicy(budget=3, say=lambda _line: None, faults_log=log)
    assert policy.restart(job, "dec-0", -9) and policy.restart(job, "enc-0", -9)
    policy.poll(job.steps())
    assert not log.exists()  # neither group has made a step since
    job.at["dec-0"] = 6
    policy.poll(job.steps())
    policy.close()  # enc-0 never recovered before the run ended
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["kind"], r["target"]) for r in rows] == [("restart", "dec-0"), ("restart", "enc-0")]
    assert rows[0]["recovered_after_s"] >= 0 and rows[1]["recovered_after_s"] is None


def test_a_job_that_makes_no_step_says_so_with_why_at_a_bounded_interval(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from nebula_mq.launch import supervisor
    from nebula_mq.launch.supervisor import StallWatch

    clock = [1000.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: clock[0])
    said: list[str] = []
    watch = StallWatch(said.append)
    why = ["head-0 (cluster-a) waits for reply-head-0 from cluster-b: nothing for 31 s"]
    for t, steps in ((0, {"head-0": 0}), (20, {"head-0": 0}), (29, {"head-0": 0})):
        clock[0] = 1000.0 + t
        watch.watch(steps, lambda: why)
    assert said == []  # 29 s without a step: not yet
    clock[0] = 1031.0
    watch.watch({"head-0": 0}, lambda: why)
    assert said == ["no step for 31 s:", f"  {why[0]}"]
    clock[0] = 1040.0
    watch.watch({"head-0": 0}, lambda: why)
    assert len(said) == 2  # said at most every STALL_S
    clock[0] = 1062.0
    watch.watch({"head-0": 0}, lambda: [])
    assert said[-1] == "no step for 62 s (no worker says it waits)"
    clock[0] = 1063.0
    watch.watch({"head-0": 1}, lambda: why)  # a step: the count starts again
    clock[0] = 1090.0
    watch.watch({"head-0": 1}, lambda: why)
    assert len(said) == 3


def test_a_job_of_long_steps_is_not_called_stalled_unless_a_worker_says_it_waits(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from nebula_mq.launch import supervisor
    from nebula_mq.launch.supervisor import StallWatch

    clock = [0.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: clock[0])
    said: list[str] = []
    watch = StallWatch(said.append)
    for t, step in ((0, 0), (5, 1), (45, 2), (85, 3)):  # 40 s a step
        clock[0] = t
        watch.watch({"dec-0": step}, lambda: [])
    clock[0] = 150.0  # 65 s since the last step: less than three of its steps
    watch.watch({"dec-0": 3}, lambda: [])
    assert said == []
    watch.watch({"dec-0": 3}, lambda: ["dec-0 (cluster-b) waits for acts from cluster-a: nothing for 30 s"])
    assert said[0] == "no step for 65 s:"  # a worker that says it waits is said at once
    clock[0] = 210.0  # 125 s: past three long steps, even with nobody waiting
    watch.watch({"dec-0": 3}, lambda: [])
    assert said[-1] == "no step for 125 s (no worker says it waits)"
