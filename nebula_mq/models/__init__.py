"""Models of nebula-mq (the only package besides workers that imports paddle).

Import paddle-free parts directly: :mod:`.pretrained` (weight parsing, numpy),
:mod:`.tokenizers` (offline tokenizers), :mod:`.reference` (numpy BERT oracle).
Paddle parts: :mod:`.bert` (BERT with adapter slots), :mod:`.abnet` (Scenario II).
This ``__init__`` imports nothing so the data pipeline can use the numpy parts
without paddle installed.
"""
