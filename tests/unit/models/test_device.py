"""``[job] device``: cpu, gpu, gpu:N or auto, resolved against what paddle sees."""

from __future__ import annotations

import pytest

pytest.importorskip("paddle")

from nebula_mq.errors import ConfigError  # noqa: E402
from nebula_mq.models.device import resolve_device, visible_gpus  # noqa: E402

pytestmark = pytest.mark.paddle


def test_cpu_is_the_cpu_and_auto_is_a_gpu_only_when_paddle_sees_one() -> None:
    assert resolve_device("cpu", local_rank=3) == "cpu"
    gpus = visible_gpus()
    assert resolve_device("auto", local_rank=1) == (f"gpu:{1 % gpus}" if gpus else "cpu")


def test_a_gpu_this_machine_lacks_is_a_config_error() -> None:
    gpus = visible_gpus()
    with pytest.raises(ConfigError, match="GPU"):
        resolve_device(f"gpu:{gpus}")  # one past the last
    if gpus == 0:
        with pytest.raises(ConfigError, match="no GPU"):
            resolve_device("gpu")


def test_an_unknown_device_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cpu, gpu, gpu:N or auto"):
        resolve_device("tpu")
