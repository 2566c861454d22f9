"""Benchmarks behind ``nebula-mq bench <name>``; each module exposes ``run(args) -> int``."""
