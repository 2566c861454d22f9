"""``nebula-mq status``: columns stay put when a value is missing, rates stop with the worker,
ELECTRA's losses are shown, and a job that never ran is an error, not an empty table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_mq.cli import main
from nebula_mq.cli.status import table, worker_rows

T0 = 1_700_000_000.0


def write_worker(run_dir: Path, worker: str, role: str, state: str, values: dict[str, float], steps: int,
                 updated: float) -> None:
    (run_dir / "status").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "status" / f"{worker}.json").write_text(json.dumps(
        {"worker": worker, "role": role, "cluster": "cluster-b", "job": "st", "pid": 0, "state": state,
         "step": steps, "updated": updated, "values": values}))
    (run_dir / "metrics" / f"{worker}.prom").write_text(
        f"# TYPE nebula_started_timestamp gauge\nnebula_started_timestamp {T0}\n"
        f"# TYPE nebula_steps counter\nnebula_steps_total {float(steps)}\n")


def test_missing_values_keep_the_columns_and_finished_workers_keep_their_rate(tmp_path: Path) -> None:
    write_worker(tmp_path, "disc-root", "electra-root", "finished", {"total_loss": 2.5, "rtd_acc": 0.9}, 50,
                 T0 + 100)
    write_worker(tmp_path, "gen", "electra-generator", "finished", {}, 50, T0 + 100)
    rows = {r["worker"]: r for r in worker_rows(tmp_path, now=T0 + 10_000)}
    assert rows["disc-root"]["loss"] == 2.5  # ELECTRA's discriminator records total_loss
    assert rows["gen"]["loss"] is None
    # 50 steps over the 100 s the worker ran, not over the 10,000 s since it started.
    assert rows["gen"]["steps_per_s"] == pytest.approx(0.5)
    lines = table(list(rows.values())).splitlines()
    header, by_worker = lines[0], {line.split()[0]: line for line in lines[1:]}
    assert all(len(line) == len(header) for line in lines)
    loss_column = slice(header.index("step") + 4, header.index("loss") + 4)  # right-aligned under "loss"
    assert by_worker["gen"][loss_column].strip() == "-"
    assert by_worker["disc-root"][loss_column].strip() == "2.5000"
    step_s = slice(header.index("loss") + 4, header.index("step/s") + 6)
    assert by_worker["gen"][step_s].strip() == "0.50"


def test_a_job_that_never_ran_is_an_error_naming_the_status_dir(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nid = "never"\nrun_dir = "{tmp_path / "run"}"\n')
    assert main(["status", str(job), "--stack", str(tmp_path / "no-stack")]) == 1
    err = capsys.readouterr().err
    assert "no worker of job 'never' has started" in err and str(tmp_path / "run" / "status") in err

