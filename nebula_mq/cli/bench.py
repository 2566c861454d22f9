"""``nebula-mq bench <name>``: micro-benchmarks. Add one by adding a row to BENCHES."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# name -> (module exposing add_arguments(parser) and run(args) -> int, help text)
BENCHES: dict[str, tuple[str, str]] = {
    "codecs": ("nebula_mq.bench.codecs", "codec ratio, error and single-core MB/s on activation-shaped tensors"),
    "transport": ("nebula_mq.bench.transport", "goodput over the shaped TLS federation link, loopback rates, WAN-cut recovery"),
    "scenario1": ("nebula_mq.bench.scenario1", "ELECTRA samples/s inside one cluster vs across two (170 Mbit/s WAN), vs n"),
    "compute": ("nebula_mq.bench.compute", "ABNet: each side's seconds and GFLOP/s per step vs a plain matmul, same run"),
    "wan": ("nebula_mq.bench.wan", "split/ABNet job inside one cluster vs across the shaped WAN: samples/s ratio"),
    "replicas": ("nebula_mq.bench.replicas", "replicas job: DiLoCo vs Streaming DiLoCo across the shaped WAN, "
                 "compute utilisation per cluster"),
    "scaling": ("nebula_mq.bench.scaling", "split/ABNet at 1x1, 2x1, 1x2, 2x2 ranks: samples/s and wire bytes per sample"),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark")
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (module, help_text) in BENCHES.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json-out", dest="json", metavar="PATH", help="also write the results as JSON to PATH")
        p.add_argument("--quick", action="store_true", help="fewer repeats, smaller set (CI smoke run)")
        # Bench modules import only the standard library at the top; heavy imports wait for run().
        add = getattr(importlib.import_module(module), "add_arguments", None)
        if add is not None:
            add(p)
        p.set_defaults(func=_runner(module))


def _runner(module: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        from nebula_mq.cli.sigterm import sigterm_unwinds

        with sigterm_unwinds():  # a row's workers are killed and its stack's links put back
            return int(importlib.import_module(module).run(args))  # heavy imports only now
    return run
