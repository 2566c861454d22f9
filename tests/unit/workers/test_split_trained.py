"""Using what a split job trained (workers.split.trained): load, predict and export reproduce
the tail's outputs from the checkpoints, in either framework."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import SPLIT_EXAMPLE, split_pair, split_settings

pytestmark = pytest.mark.paddle
torch = pytest.importorskip("torch")
sys.path.insert(0, str(SPLIT_EXAMPLE))
import mlp  # noqa: E402
import mlp_data  # noqa: E402
import mlp_torch  # noqa: E402

TORCH = split_pair(mlp_torch.build_head, mlp_torch.build_tail)
PADDLE_HEAD_TORCH_TAIL = split_pair(mlp.build_head, mlp_torch.build_tail)


def trained_job(tmp_path: Path, run_pair: Any, head: str) -> Settings:
    """A split job file's settings (builders named) after 30 steps, checkpoints every 5 (the last
    at 30 on both sides)."""
    base = split_settings(tmp_path, steps=30)
    settings = Settings(job=base.job, codec=base.codec, transport=base.transport,
                        split={**base.section("split"), "head": f"{head}:build_head", "tail": "mlp_torch:build_tail"},
                        source=str(SPLIT_EXAMPLE / "job.toml"))
    run_pair(settings, MemoryBroker())
    return settings


def test_predict_reproduces_the_tail_output_from_the_checkpoints_and_the_export(tmp_path: Path) -> None:
    from workers.split import export, load, predict

    settings = trained_job(tmp_path, TORCH, "mlp_torch")
    x, y = mlp_data.dataset()
    ids = mlp_data.batch_ids(3)
    out = predict(settings, (x[ids],))
    assert out.shape == (len(ids), 1)

    # The same numbers from the raw checkpoint arrays, computed by hand in torch.
    arrays = {}
    for side, worker in (("head", "head-0"), ("tail", "tail-0")):
        ck = CheckpointStore(tmp_path / "checkpoints" / worker).latest()
        assert ck is not None and ck.step == 30
        arrays[side] = {k.split("/param/")[1]: torch.from_numpy(v) for k, v in ck.arrays.items() if "/param/" in k}
    bottom, top = mlp_torch.bottom(seed=5), mlp_torch.top(seed=6)  # other initial weights: all come from the checkpoint
    bottom.load_state_dict(arrays["head"])
    top.load_state_dict(arrays["tail"])
    bottom.eval()
    top.eval()
    with torch.no_grad():
        expected = top(bottom(torch.from_numpy(x[ids]))).numpy()
    np.testing.assert_array_equal(out, expected)
    assert float(np.mean((out - y[ids]) ** 2)) < 0.5 * float(np.var(y))  # it learned

    # The export loads with torch.load into the builder's model and gives the same outputs.
    manifest = export(settings, tmp_path / "export")
    assert manifest["step"] == 30 and manifest["job"] == "unit-split"
    assert {s: e["framework"] for s, e in manifest["sides"].items()} == {"head": "torch", "tail": "torch"}
    assert json.loads((tmp_path / "export" / "manifest.json").read_text()) == manifest
    bottom2, top2 = mlp_torch.bottom(seed=8), mlp_torch.top(seed=9)
    bottom2.load_state_dict(torch.load(tmp_path / "export" / "head.pt"))
    top2.load_state_dict(torch.load(tmp_path / "export" / "tail.pt"))
    bottom2.eval()
    top2.eval()
    with torch.no_grad():
        np.testing.assert_array_equal(top2(bottom2(torch.from_numpy(x[ids]))).numpy(), out)
    assert load(settings, "tail").checkpoint_digest == manifest["sides"]["tail"]["checkpoint_digest"]


def test_a_paddle_head_and_a_torch_tail_export_in_their_own_formats(tmp_path: Path) -> None:
    import paddle

    from workers.split import export, predict

    settings = trained_job(tmp_path, PADDLE_HEAD_TORCH_TAIL, "mlp")
    manifest = export(settings, tmp_path / "export")
    assert (manifest["sides"]["head"]["file"], manifest["sides"]["tail"]["file"]) == ("head.pdparams", "tail.pt")
    assert set(paddle.load(str(tmp_path / "export" / "head.pdparams"))) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    x, y = mlp_data.dataset()
    ids = mlp_data.batch_ids(0)
    assert float(np.mean((predict(settings, (x[ids],)) - y[ids]) ** 2)) < 0.5 * float(np.var(y))


def test_load_before_any_checkpoint_pair_is_a_one_line_checkpoint_error(tmp_path: Path) -> None:
    from workers.split import load

    base = split_settings(tmp_path, steps=30)
    settings = Settings(job=base.job, split={**base.section("split"), "head": "mlp_torch:build_head"},
                        source=str(SPLIT_EXAMPLE / "job.toml"))
    with pytest.raises(CheckpointError, match=r"no checkpoint pair under .*checkpoints: head has \[\], tail has \[\]"):
        load(settings, "head")


def test_the_export_command_writes_both_halves_and_refuses_a_job_of_another_scenario(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    root = Path(__file__).resolve().parents[3]
    assert main(["export", str(root / "config" / "demo.toml"), "--out", str(tmp_path / "x")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "job.scenario" in err and "split" in err, err
    assert not (tmp_path / "x").exists()
