"""A broker that lost its data, on real TLS nodes: cluster-b's node is stopped mid-run, its mnesia
directory (vhosts, users, queues, the message store) deleted, and the node started again.

The job must not hang: the tail, which waits for activations on cluster-b, stops within a bounded
time with one ``BrokerDataLost`` line that names the cluster, itself and the micro-batches it
still needs; it applies nothing after the wipe. Provisioned again (as ``nebula-mq run`` does) and
started again, it stops at once with the same error, naming the incarnation the broker lost,
instead of waiting for micro-batches nobody will send. A private stack (``running_stack``): wiping a
node of the session stack would take every other test's jobs with it.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nebula_mq.launch import JobProcesses
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.lost_broker import INCARNATION_FILE
from nebula_mq.stack import node as nodes
from nebula_mq.stack.layout import NodeLayout
from tests.fixtures.jobs import copy_split_example, split_job
from tests.fixtures.stack import CLUSTERS, running_stack

pytestmark = [pytest.mark.broker, pytest.mark.paddle]

B = CLUSTERS[1]
WIPE_AT_STEP = 12  # the tail's step when cluster-b's node is stopped (it checkpoints every 5)
START_S = 60.0  # for the workers to import paddle and reach WIPE_AT_STEP
STOP_S = 40.0  # from the restarted node to the tail's exit: the watch needs ~5 s of it
RESTART_S = 60.0  # a restarted tail: paddle's import, then the check at its inbox's opening


def wipe_data(node: NodeLayout) -> None:
    """Delete a stopped node's data (its mnesia directory: vhosts, users, permissions, queues and
    the message store), as a lost disk or a re-installed host would; the next ``start`` boots it
    empty. Its configuration and certificates stay."""
    assert not nodes.is_running(node), f"{node.node}: stop it before wiping its data"
    shutil.rmtree(node.mnesia_base, ignore_errors=True)
    node.mnesia_base.mkdir(parents=True, exist_ok=True)


def errors(log: Path) -> list[dict[str, str]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "error":
            out.append(record)
    return out


def steps(job: JobProcesses, worker: str) -> int:
    return job.steps().get(worker, 0)


def test_a_wiped_broker_stops_the_waiting_side_with_the_missing_range(tmp_path: Path) -> None:
    copy_split_example(tmp_path)
    config = tmp_path / "job.toml"
    run_dir = tmp_path / "run"
    with running_stack(CLUSTERS, "nwp") as handle:
        config.write_text(split_job("wipe", run_dir, steps=5000, forward="none", backward="none", in_flight=2,
                                    checkpoint_every=5))
        job = JobProcesses(str(config), handle.run_dir)
        job.provision()
        job.start_all()
        try:
            deadline = time.monotonic() + START_S
            while steps(job, "tail-0") < WIPE_AT_STEP and time.monotonic() < deadline and not job.failed():
                time.sleep(0.2)
            assert steps(job, "tail-0") >= WIPE_AT_STEP, {w: (job.logs / f"{w}.log").read_text()[-1500:]
                                                         for w in job.children}
            note = run_dir / "checkpoints" / "tail-0" / INCARNATION_FILE
            assert json.loads(note.read_text())["cluster"] == B  # the broker its checkpoints are made with
            node = handle.stack.layout.node(B)
            nodes.stop(node)
            stopped_at = steps(job, "tail-0")
            wipe_data(node)  # vhosts, users, queues, messages
            nodes.start(node)
            tail = job.children["tail-0"]
            try:
                code = tail.wait(STOP_S)
            except subprocess.TimeoutExpired:  # a hang: the failure this test is about
                code = None
            job.drain_logs("tail-0")
            log = (job.logs / "tail-0.log").read_text()
            assert code == 1, log[-3000:]
            found = errors(job.logs / "tail-0.log")
            assert [r["error"] for r in found] == ["BrokerDataLost"], found
            message = found[0]["message"]
            checkpoints = CheckpointStore(run_dir / "checkpoints" / "tail-0").steps()
            m = re.fullmatch(
                rf"{B}'s broker lost the job's data \(vhost nebula-wipe is gone: .*\): tail-0 needs "
                r"micro-batches (\d+)\.\. of flow 'activations' \(applied up to (\d+)\) "
                r"\(its last checkpoint is step (\d+)\); they are on no broker any more, and the producers' "
                r"checkpoints count them as sent: re-provision the job and start it over \(see docs/faults.md: "
                r"Recovering a broker that lost its data\)", message)
            assert m is not None, message
            first, applied, checkpoint = (int(g) for g in m.groups())
            # Nothing accepted after the wipe: what it needs follows what it had applied when
            # the node stopped, and no checkpoint was written past it. A checkpoint at step s
            # holds micro-batches 0..s-1, so one taken at the stop itself is at step `first`.
            assert first == applied + 1 and abs(first - stopped_at) <= 2, (message, stopped_at)
            assert checkpoint == checkpoints[-1] <= first, (checkpoints, message)
            # Provisioned again and restarted: it stops at its opening, from its checkpoint.
            job.provision()
            job.start("tail-0")
            try:
                code = job.children["tail-0"].wait(RESTART_S)
            except subprocess.TimeoutExpired:  # a hang: the failure this test is about
                code = None
            job.drain_logs("tail-0")
            again = errors(job.logs / "tail-0.log")[1:]
            assert code == 1 and [r["error"] for r in again] == ["BrokerDataLost"], (
                code, again, (job.logs / "tail-0.log").read_text()[-3000:])
            assert re.search(rf"{B}'s broker lost the job's data \(vhost nebula-wipe was provisioned again since "
                             r"tail-0's checkpoints: its incarnation \S+ is gone, the broker has \S+\): tail-0 needs "
                             rf"micro-batches {checkpoint}\.\. of flow 'activations' \(applied up to {checkpoint - 1}\) "
                             rf"\(its last checkpoint is step {checkpoint}\)", again[0]["message"]), again[0]["message"]
            assert CheckpointStore(run_dir / "checkpoints" / "tail-0").steps() == checkpoints  # nothing applied
        finally:
            job.signal_all(signal.SIGKILL)
            job.wait_all(10)
