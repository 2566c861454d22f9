"""Models of nebula-mq (the only package besides workers that imports paddle).

Import paddle-free parts directly: :mod:`.pretrained` (weight parsing, numpy); the
tokenizers live in :mod:`nebula_mq.data.tokenizers`.
Paddle parts: :mod:`.bert` (BERT with adapter slots), :mod:`.abnet` (Scenario II).
This ``__init__`` imports no paddle, so the data pipeline can use the numpy parts
without paddle installed. It selects MKL's fast code path on AMD CPUs before any
paddle matrix product can run (:mod:`.cpu`).
"""

from nebula_mq.models.cpu import select_mkl_code_path

select_mkl_code_path()
