"""Gloo data parallelism among sub-discriminators: 2 CPU processes == 1 process on the whole batch."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("paddle")

pytestmark = pytest.mark.paddle

STEPS, RANKS, ROWS = 2, 2, 4


def _micro_batches() -> list[list[dict[str, np.ndarray]]]:
    """batches[step][rank]: full-length rows, so every micro-batch has equal token counts."""
    from nebula_mq.models.electra import electra_config
    from nebula_mq.models.electra_trainers import GeneratorTrainer

    cfg = electra_config({"preset": "tiny"})
    gen = GeneratorTrainer(cfg)
    rng = np.random.default_rng(5)
    out = []
    for step in range(STEPS):
        row = []
        for rank in range(RANKS):
            ids = rng.integers(5, cfg.vocab_size, size=(ROWS, cfg.max_len)).astype(np.int32)
            ids[:, 0], ids[:, -1] = cfg.bos_id, cfg.eos_id
            row.append(gen.corrupt_without_training(ids, seed=100 * step + rank)[0])
        out.append(row)
    return out


def _recorder(inner, sink: list[dict[str, np.ndarray]]):
    def sync(model) -> None:
        if inner is not None:
            inner(model)
        sink.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
    return sync


def _worker(rank: int, base_port: int, data: Path, out: Path) -> None:
    from nebula_mq.models.data_parallel import init_group
    from nebula_mq.models.electra import electra_config
    from nebula_mq.models.electra_trainers import DiscriminatorTrainer

    endpoints = [f"127.0.0.1:{base_port + 1 + r}" for r in range(RANKS)]
    group = init_group(rank, RANKS, endpoints, master=f"127.0.0.1:{base_port}")
    grads: list[dict[str, np.ndarray]] = []
    trainer = DiscriminatorTrainer(electra_config({"preset": "tiny"}), gradient_sync=_recorder(group, grads))
    with np.load(data) as npz:
        batches = [{k.split("/", 2)[2]: npz[k] for k in npz.files if k.startswith(f"{s}/{rank}/")}
                   for s in range(STEPS)]
    metrics = [trainer.train_step(b) for b in batches]
    group.barrier()
    state = trainer.state_arrays()
    np.savez(out, **{f"state/{k}": v for k, v in state.items()},
             **{f"grad/{k}": v for k, v in grads[0].items()}, loss=np.array([m["disc_loss"] for m in metrics]))


@pytest.mark.timeout(120)
def test_two_gloo_processes_match_one_process_on_the_concatenated_batch(tmp_path: Path) -> None:
    from nebula_mq.models.electra import electra_config
    from nebula_mq.models.electra_trainers import DiscriminatorTrainer
    from nebula_mq.runtime.checkpoint import state_digest

    batches = _micro_batches()
    data = tmp_path / "batches.npz"
    np.savez(data, **{f"{s}/{r}/{k}": v for s, row in enumerate(batches) for r, b in enumerate(row)
                      for k, v in b.items()})
    from nebula_mq.stack.layout import free_group_port  # not at the top: ranks run this file as a script

    base = free_group_port(RANKS)
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(base), str(data), str(tmp_path / f"r{r}.npz")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(RANKS)]
    for p in procs:
        output, _ = p.communicate(timeout=100)
        assert p.returncode == 0, output.decode(errors="replace")[-3000:]
    ranks = [dict(np.load(tmp_path / f"r{r}.npz")) for r in range(RANKS)]

    # Every rank ends with the same state, bit for bit.
    digests = {state_digest({k: v for k, v in r.items() if k.startswith("state/")}) for r in ranks}
    assert len(digests) == 1

    # One process on the concatenated batch: same gradients and parameters.
    grads: list[dict[str, np.ndarray]] = []
    single = DiscriminatorTrainer(electra_config({"preset": "tiny"}), gradient_sync=_recorder(None, grads))
    for row in batches:
        whole = {k: np.concatenate([b[k] for b in row]) if k != "mlm_loss" else row[0][k] for k in row[0]}
        single.train_step(whole)
    for name, g in grads[0].items():
        np.testing.assert_allclose(ranks[0][f"grad/{name}"], g, rtol=1e-4, atol=1e-7, err_msg=name)
    for name, value in single.state_arrays().items():
        if name.startswith("model/"):
            np.testing.assert_allclose(ranks[0][f"state/{name}"], value, rtol=1e-4, atol=2e-6, err_msg=name)
    # The ranks saw different data: their local losses differ, the shared update does not.
    assert ranks[0]["loss"][0] != ranks[1]["loss"][0]


@pytest.mark.timeout(90)
def test_a_rank_whose_peer_never_comes_exits_with_a_clear_error_instead_of_waiting(tmp_path: Path) -> None:
    """The rendezvous (as every collective) runs under a deadline: a dead or missing peer
    ends the process, saying where it waited, so the launcher restarts the group."""
    from nebula_mq.stack.layout import free_group_port

    base = free_group_port(2)
    code = ("from nebula_mq.models.data_parallel import init_group\n"
            f"init_group(0, 2, ['127.0.0.1:{base + 1}', '127.0.0.1:{base + 2}'], master='127.0.0.1:{base}', "
            "timeout_s=4)\nprint('joined')")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=80)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1 and b"joined" not in proc.stdout, err[-2000:]
    assert "Timeout (0:00:04)!" in err and "in init_group" in err, err[-2000:]
    assert time.monotonic() - t0 < 60  # the deadline, plus paddle's import


if __name__ == "__main__":  # a sub-discriminator process of the test above
    _worker(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))


def test_rendezvous_ports_inside_the_ephemeral_range_are_named_in_a_warning(tmp_path: Path) -> None:
    """A rank whose port lies where the kernel picks outgoing connections' ports may lose it to
    one of them before it listens: the rendezvous says so, naming the ports and a safe bound."""
    from structlog.testing import capture_logs

    from nebula_mq.models.collectives import ephemeral_ports, warn_ephemeral_ports

    source = tmp_path / "ip_local_port_range"
    source.write_text("32768\t60999\n")
    assert ephemeral_ports(source) == range(32768, 61000)
    with capture_logs() as logs:
        assert warn_ephemeral_ports(["127.0.0.1:36200", "10.0.0.2:36202", "h:29200"], source) == [36200, 36202]
    assert [(e["event"], e["ports"], e["ephemeral"]) for e in logs] == [
        ("gloo_ports_in_ephemeral_range", [36200, 36202], "32768-60999")]
    assert "below 32768" in logs[0]["hint"]
    with capture_logs() as logs:
        assert warn_ephemeral_ports(["127.0.0.1:29200", "127.0.0.1:29201"], source) == []
    assert logs == []
    assert ephemeral_ports(tmp_path / "absent") is None  # not Linux: nothing to check


def test_the_default_rendezvous_ports_lie_below_the_kernels_ephemeral_range() -> None:
    """Every default and shipped job file keeps its gloo ports (master and ranks) below
    Linux's default ephemeral range, so a host's own connections cannot take them."""
    import tomllib

    from workers.electra.common import ElectraJob
    from workers.split.job import SplitJob

    ports = [SplitJob.head_gloo_port, SplitJob.tail_gloo_port, ElectraJob.gloo_base_port]
    config = Path(__file__).resolve().parents[3] / "config"
    for path in sorted(config.glob("*.toml")):
        for table in tomllib.loads(path.read_text()).values():
            if isinstance(table, dict):
                ports += [v for k, v in table.items() if k.endswith("gloo_port") or k == "gloo_base_port"]
    assert len(ports) >= 7 and all(1024 < p and p + 64 < 32768 for p in ports), ports
