"""Cluster T: `python examples/split_mlp/tail.py examples/split_mlp/job.toml`."""
import sys

from paddle.nn.functional import mse_loss

from mlp import dataset, top
from mlp_data import baseline
from workers.split import run_tail

_, y = dataset()
sys.exit(run_tail(sys.argv[1], model=top(), loss=mse_loss, targets=lambda ids: y[ids], baseline=baseline(y)))
