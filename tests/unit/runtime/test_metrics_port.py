"""A worker's metrics server on a port it cannot have: a typed error naming the port."""

from __future__ import annotations

import socket

import pytest

from nebula_mq.errors import WorkerError
from nebula_mq.runtime.metrics import MetricsHook


def test_a_busy_metrics_port_is_a_worker_error_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(WorkerError) as info:
            MetricsHook("encoder", port=port)
    assert f"cannot serve metrics on port {port}" in str(info.value)
    assert "--metrics-port" in str(info.value)


def test_a_metrics_port_out_of_range_is_a_worker_error() -> None:
    with pytest.raises(WorkerError, match="got 70000"):
        MetricsHook("encoder", port=70000)
