"""Cluster S: `python examples/split_mlp/head.py examples/split_mlp/job.toml`."""
import sys

from mlp import batch_ids, bottom, dataset
from workers.split import run_head

x, _ = dataset()
sys.exit(run_head(sys.argv[1], model=bottom(), inputs=lambda mb: (ids := batch_ids(mb), x[ids])))
