"""An example under every verb's ``--help`` (the argparse epilog), kept in one place so that
a test can check every verb has one and that each names its own command."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

EXAMPLES: dict[str, tuple[str, ...]] = {
    "audit verify": ("nebula-mq audit verify --log run/jobs/demo/audit/audit.jsonl",),
    "audit show": ("nebula-mq audit show --log run/jobs/demo/audit/audit.jsonl --event message_dead_lettered",),
    "audit scan-broker": ("nebula-mq audit scan-broker --stack run/stack",),
    "audit dead-letters": ("nebula-mq audit dead-letters config/demo.toml --log run/jobs/demo/audit/audit.jsonl",),
    "bench codecs": ("nebula-mq bench codecs --quick --json-out run/bench/codecs.json", "nebula-mq bench codecs --peers"),
    "bench transport": ("nebula-mq bench transport --quick", "nebula-mq bench transport --recovery"),
    "bench scenario1": ("nebula-mq bench scenario1 --n 1,2 --delay-ms 20",),
    "bench compute": ("nebula-mq bench compute config/demo.toml",),
    "bench wan": ("nebula-mq bench wan config/demo.toml --steps 120 --rates 10,60 --delay-ms 20,100 --repeats 3",
                  "nebula-mq bench wan config/demo.toml --codecs auto --rates 3 --delay-ms 20,100"),
    "bench scaling": ("nebula-mq bench scaling config/demo.toml --steps 40",),
    "bench replicas": ("nebula-mq bench replicas config/replicas.toml --stack run/stack-3 --rounds 10",),
    "certs init": ("nebula-mq certs init run/certs --clusters cluster-a,cluster-b",),
    "certs issue": ("nebula-mq certs issue run/certs cluster-a demo.enc-0",
                    "nebula-mq certs issue run/certs cluster-a server --hostname broker-a.example.org"),
    "certs request": ("nebula-mq certs request /etc/nebula/certs cluster-b server --hostname broker-b.example.org",),
    "certs sign": ("nebula-mq certs sign run/certs cluster-b request.csr --server --out broker-b.pem",),
    "certs install": ("nebula-mq certs install /etc/nebula/certs cluster-b server broker-b.pem",),
    "certs rotate": ("nebula-mq certs rotate run/certs cluster-b server",),
    "certs revoke": ("nebula-mq certs revoke run/certs cluster-a demo.enc-0",),
    "certs list": ("nebula-mq certs list run/certs",),
    "certs export-ca": ("nebula-mq certs export-ca run/certs cluster-a > cluster-a-ca.pem",),
    "certs export-crl": ("nebula-mq certs export-crl run/certs cluster-a > cluster-a-crl.pem",),
    "certs import-crl": ("nebula-mq certs import-crl run/certs cluster-b cluster-a cluster-a-crl.pem",),
    "certs import-ca": ("nebula-mq certs import-ca run/certs cluster-b cluster-a cluster-a-ca.pem",),
    "chaos": ("nebula-mq chaos config/demo.toml --cuts 5,10,30 --stall 20",),
    "compare": ("nebula-mq compare run/jobs/abnet-corpus-none run/jobs/abnet-corpus-int4",),
    "config show": ("nebula-mq config show config/demo.toml", "NEBULA__JOB__STEPS=50 nebula-mq config show config/demo.toml"),
    "config reference": ("nebula-mq config reference > docs/CONFIG.md",),
    "data build": ("nebula-mq data build",),
    "data stats": ("nebula-mq data stats --json",),
    "data-access grant": ("nebula-mq data-access grant run/data-root alice demo gettext",),
    "data-access revoke": ("nebula-mq data-access revoke run/data-root alice demo gettext",),
    "data-access list": ("nebula-mq data-access list run/data-root alice",),
    "export": ("nebula-mq export examples/split_mlp/job-torch.toml --out run/export/split-mlp-torch",),
    "eval": ("nebula-mq eval config/demo.toml --src my.src --ref my.ref --out run/eval.json",),
    "provision": ("nebula-mq provision job.toml --cluster cluster-a --admin-password-file admin.pw",
                  "nebula-mq provision job.toml --cluster cluster-b --dry-run"),
    "deprovision": ("nebula-mq deprovision job.toml --cluster cluster-a --admin-password-file admin.pw",),
    "probe": ("nebula-mq probe config/electra-tiny.toml --json-out run/probe.json",),
    "report": ("nebula-mq report run/jobs/demo --out run/report",
               "nebula-mq report config/demo.toml --serve --feed cluster-b"),
    "run": ("nebula-mq run config/demo.toml", "nebula-mq run config/demo.toml --metrics-port 9300 --max-restarts 10"),
    "demo": ("nebula-mq demo",),
    "stack up": ("nebula-mq stack up --clusters cluster-a,cluster-b",
                 "nebula-mq stack up --clusters cluster-a --hostname a1.example.org --base-port 5671"),
    "stack trust": ("nebula-mq stack trust cluster-b b1.example.org:5671 --fingerprint sha256:9f86d08...",),
    "stack status": ("nebula-mq stack status",),
    "stack down": ("nebula-mq stack down",),
    "stack restart": ("nebula-mq stack restart cluster-b",),
    "status": ("nebula-mq status config/demo.toml", "nebula-mq status config/demo.toml --json",
               "nebula-mq status job.toml --feed cluster-b --lost-after 30"),
    "up": ("nebula-mq up job.toml --cluster cluster-a", "nebula-mq up job.toml --cluster cluster-a --ranks 0",
           "nebula-mq up job.toml --cluster cluster-a --ranks 1 --broker-host a1.example.org"),
    "study compression": ("nebula-mq study compression --real --rates auto --out run/study-real",),
    "wan shape": ("nebula-mq wan shape --rate-mbit 60 --delay-ms 20",),
    "wan cut": ("nebula-mq wan cut --to cluster-b",),
    "wan drop": ("nebula-mq wan drop cluster-b",),
    "wan heal": ("nebula-mq wan heal",),
    "wan status": ("nebula-mq wan status",),
    "worker": ("nebula-mq worker job.toml --role abnet-encoder --index 0 --stack run/stack",),
}


def verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every leaf command (``"stack up"``) with its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs and path:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from verbs(sub, (*path, name))


# Under `nebula-mq --help`: where to begin.
START = """start here:
  nebula-mq demo                              set up the local stack and train the flagship job end to end
  nebula-mq run examples/split_mlp/job.toml   your own model split across two clusters (examples/README.md)
  nebula-mq up job.toml --cluster cluster-a   this host's part of a job deployed over several hosts
  nebula-mq COMMAND --help                    each command's options, with examples

The README's quick start: ./dev.sh demo (set up and run the main job), ./dev.sh test (the tests)."""


def _epilog(lines: tuple[str, ...]) -> str:
    return "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {x}" for x in lines)


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Each leaf verb's examples under its help; each group's (``stack``, ``bench``...) one per
    leaf; where to begin under ``nebula-mq --help``."""
    parser.epilog, parser.formatter_class = START, argparse.RawDescriptionHelpFormatter
    groups: dict[str, list[str]] = {}
    for verb, sub in verbs(parser):
        lines = EXAMPLES.get(verb)
        if lines:
            sub.epilog = _epilog(lines)
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
            if " " in verb:
                groups.setdefault(verb.split(" ")[0], []).append(lines[0])
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subparsers there
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, group in action.choices.items():
                if name in groups:
                    group.epilog = _epilog(tuple(groups[name]))
                    group.formatter_class = argparse.RawDescriptionHelpFormatter
