"""The replicas job's outer step (workers/replicas/outer.py) against DiLoCo's update written out
directly, and its compression (workers/replicas/compression.py); numpy only, no framework."""

from __future__ import annotations

import numpy as np
import pytest

from nebula_mq.codecs import decode_tree
from nebula_mq.errors import ConfigError
from nebula_mq.settings import JobSettings, Settings
from workers.replicas.compression import PseudoGradientCompression
from workers.replicas.job import load_job
from workers.replicas.outer import OuterNesterov, average
from workers.replicas.plan import plan


def rounds(seed: int, n: int, count: int) -> list[list[dict[str, np.ndarray]]]:
    """``count`` rounds of ``n`` clusters' pseudo-gradients for two parameters."""
    rng = np.random.default_rng(seed)
    return [[{"w": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
             for _ in range(n)] for _ in range(count)]


def diloco_reference(theta: dict[str, np.ndarray], pseudo: list[list[dict[str, np.ndarray]]], lr: float,
                     mu: float) -> list[dict[str, np.ndarray]]:
    """DiLoCo's outer loop in float64, as the paper writes it: Δ = mean over workers of
    (θ − θ_i); v ← μ v + Δ; θ ← θ − lr (Δ + μ v) (SGD with Nesterov momentum)."""
    theta = {k: v.astype(np.float64) for k, v in theta.items()}
    v = {k: np.zeros_like(t) for k, t in theta.items()}
    out = []
    for clusters in pseudo:
        for k in theta:
            delta = sum(c[k].astype(np.float64) for c in clusters) / len(clusters)
            v[k] = mu * v[k] + delta
            theta[k] = theta[k] - lr * (delta + mu * v[k])
        out.append({k: t.copy() for k, t in theta.items()})
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_outer_step_is_dilocos_update_over_several_rounds(n: int) -> None:
    theta0 = {"w": np.full((4, 3), 0.5, np.float32), "b": np.zeros(3, np.float32)}
    pseudo = rounds(1, n, 5)
    expected = diloco_reference(theta0, pseudo, lr=0.7, mu=0.9)
    outer, theta = OuterNesterov(0.7, 0.9), dict(theta0)
    for r, clusters in enumerate(pseudo):
        theta = outer.step(theta, average(clusters))
        for k in theta:
            assert theta[k].dtype == np.float32
            np.testing.assert_allclose(theta[k], expected[r][k], rtol=1e-5, atol=1e-6)


def test_outer_step_is_torch_sgd_with_nesterov() -> None:
    """The same update as torch's SGD(nesterov=True) stepped with the pseudo-gradient, to float32
    rounding (torch fuses some of the multiply-adds, numpy does not)."""
    torch = pytest.importorskip("torch")
    theta0 = {"w": np.full((4, 3), 0.5, np.float32), "b": np.zeros(3, np.float32)}
    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in theta0.items()}
    sgd = torch.optim.SGD(list(params.values()), lr=0.7, momentum=0.9, nesterov=True)
    outer, theta = OuterNesterov(0.7, 0.9), dict(theta0)
    for clusters in rounds(2, 3, 6):
        mean = average(clusters)
        theta = outer.step(theta, mean)
        for k, p in params.items():
            p.grad = torch.tensor(mean[k])
        sgd.step()
        for k, p in params.items():
            np.testing.assert_allclose(theta[k], p.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_momentum_state_round_trips_through_a_checkpoint() -> None:
    pseudo = rounds(3, 2, 6)
    theta0 = {"w": np.ones((4, 3), np.float32), "b": np.ones(3, np.float32)}
    straight, theta = OuterNesterov(0.7, 0.9), dict(theta0)
    for clusters in pseudo:
        theta = straight.step(theta, average(clusters))
    first, resumed_theta = OuterNesterov(0.7, 0.9), dict(theta0)
    for clusters in pseudo[:3]:
        resumed_theta = first.step(resumed_theta, average(clusters))
    second = OuterNesterov(0.7, 0.9)
    second.restore(first.state_arrays("outer/momentum"), "outer/momentum")
    for clusters in pseudo[3:]:
        resumed_theta = second.step(resumed_theta, average(clusters))
    for k in theta:
        np.testing.assert_array_equal(theta[k], resumed_theta[k])


def test_lr_one_without_momentum_takes_the_average_step() -> None:
    """With outer lr 1 and no momentum the outer step is θ − mean(Δ): one cluster's own weights
    back (to float32 rounding of θ − (θ − θ_c))."""
    rng = np.random.default_rng(4)
    theta = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    local = {"w": (theta["w"] + 0.01 * rng.normal(size=(4, 3))).astype(np.float32)}
    out = OuterNesterov(1.0, 0.0).step(theta, average([{"w": theta["w"] - local["w"]}]))
    np.testing.assert_allclose(out["w"], local["w"], rtol=0, atol=1e-6)


def test_pseudo_gradients_encode_once_with_error_feedback_kept_and_checkpointed() -> None:
    rng = np.random.default_rng(5)
    deltas = [{"w": rng.normal(size=(8, 6)).astype(np.float32), "b": rng.normal(size=6).astype(np.float32)}
              for _ in range(4)]
    sender = PseudoGradientCompression("int8", feedback=True)
    sent_total = {"w": np.zeros((8, 6), np.float32), "b": np.zeros(6, np.float32)}
    for r, delta in enumerate(deltas[:2]):
        encoded, decoded = sender.encode(r, delta)
        for k in delta:
            # What the sender averages is what a receiver decodes from the bytes sent.
            received = PseudoGradientCompression.decode({k: decode_tree(encoded[k][1])}, {k: delta[k]})
            np.testing.assert_array_equal(decoded[k], received[k])
            sent_total[k] += decoded[k]
    state = sender.state_arrays("pseudograd")
    assert {"pseudograd/w/feedback/rows", "pseudograd/b/feedback/rows"} <= set(state)
    resumed = PseudoGradientCompression("int8", feedback=True)
    resumed.restore(state, ["b", "w"], "pseudograd")
    for r, delta in enumerate(deltas[2:], start=2):
        a, b = sender.encode(r, delta)[1], resumed.encode(r, delta)[1]
        for k in delta:
            np.testing.assert_array_equal(a[k], b[k])
            sent_total[k] += a[k]
    # Error feedback: what was sent adds up to what was meant, up to the last residual.
    for k in sent_total:
        meant = sum(d[k] for d in deltas)
        assert np.abs(sent_total[k] - meant).max() < 0.05 * np.abs(meant).max()


def settings(**section: object) -> Settings:
    return Settings(job=JobSettings(id="unit-replicas", scenario="replicas", steps=4),
                    replicas={"clusters": ["cluster-a", "cluster-b", "cluster-c"], **section})


def test_plan_gives_each_cluster_one_replica_and_a_flow_to_every_other() -> None:
    p = plan(settings())
    assert [(q.worker_id, q.cluster, q.role) for q in p.processes] == [
        ("replica-0", "cluster-a", "replica"), ("replica-1", "cluster-b", "replica"),
        ("replica-2", "cluster-c", "replica")]
    assert [f.name for f in p.flows] == ["pseudograd-0-1", "pseudograd-0-2", "pseudograd-1-0",
                                         "pseudograd-1-2", "pseudograd-2-0", "pseudograd-2-1"]
    assert p.processes[1].publishes == ("pseudograd-1-0", "pseudograd-1-2")
    assert p.processes[1].consumes == ("pseudograd-0-1", "pseudograd-2-1")


@pytest.mark.parametrize(("section", "key"), [({"clusters": ["cluster-a"]}, "replicas.clusters"),
                                              ({"outer_momentum": 1.0}, "replicas.outer_momentum"),
                                              ({"codec": "int9"}, "replicas.codec"),
                                              ({"inner_steps": 0}, "replicas.inner_steps")])
def test_a_bad_section_is_one_line_naming_the_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(settings(**section))
    assert info.value.key == key
