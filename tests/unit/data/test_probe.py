"""The cross-lingual transfer probe: data built from the installed catalogues, the linear
head over frozen mean-pooled states, and the run-side errors (tiny sizes: seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.data.catalogues import discover
from nebula_mq.data.probe import build_probe_set
from nebula_mq.errors import CheckpointError, ConfigError, DataError
from nebula_mq.settings import JobSettings, Settings

DOMAINS = ("git", "gnupg2")
LOCALES = ("es", "de")

needs_catalogues = pytest.mark.skipif(
    {c.locale for c in discover(locales=LOCALES) if c.name in DOMAINS} != set(LOCALES),
    reason="git/gnupg2 catalogues for es and de are not installed")


@needs_catalogues
def test_probe_set_is_balanced_aligned_and_split_by_message() -> None:
    p = build_probe_set(DOMAINS, LOCALES, per_class=20, heldout_fraction=0.25, seed=3)
    assert p.classes == DOMAINS and p.languages == ("en", "es", "de")
    assert np.bincount(p.train_labels).tolist() == [15, 15]
    assert np.bincount(p.test_labels).tolist() == [5, 5]
    assert all(len(texts) == 10 for texts in p.test_texts.values())
    assert not set(p.test_texts["en"]) & set(p.train_texts)  # held-out messages never trained on
    assert p.test_texts["es"] != p.test_texts["en"]  # translations, not the English text again
    again = build_probe_set(DOMAINS, LOCALES, per_class=20, heldout_fraction=0.25, seed=3)
    assert again.train_texts == p.train_texts and again.test_texts == p.test_texts


def test_probe_set_rejects_bad_requests() -> None:
    with pytest.raises(DataError, match="2 distinct"):
        build_probe_set(("git", "git"), LOCALES)
    with pytest.raises(DataError, match="no catalogue"):
        build_probe_set(("git", "no-such-catalogue-xyz"), LOCALES)
    with pytest.raises(DataError):
        build_probe_set(DOMAINS, LOCALES, per_class=1)


@pytest.mark.paddle
@needs_catalogues
def test_head_fits_english_and_scores_every_language() -> None:
    from nebula_mq.models.bert import BertConfig
    from nebula_mq.models.probe import BertSentenceEncoder, bert_encoder, evaluate_transfer, xlmr_token_ids

    vocab = 1024
    # A tiny random encoder over XLM-R ids folded into 1024 rows: enough signal to fit English.
    enc = BertSentenceEncoder(bert_encoder(BertConfig(vocab, 32, 1, 2, 64), seed=1),
                              xlmr_token_ids(lambda ids: ids % vocab), pad_id=1, max_len=32)
    p = build_probe_set(DOMAINS, LOCALES, per_class=24, seed=0)
    r = evaluate_transfer(enc, p, epochs=150, seed=0)
    assert set(r.accuracy) == {"en", "es", "de"}
    assert r.chance == 0.5
    assert r.train_accuracy >= 0.9
    assert all(0.0 <= a <= 1.0 for a in r.accuracy.values())
    assert r.mean_transfer() == pytest.approx((r.accuracy["es"] + r.accuracy["de"]) / 2)
    assert evaluate_transfer(enc, p, epochs=150, seed=0).accuracy == r.accuracy  # deterministic


@pytest.mark.paddle
def test_train_linear_head_rejects_mismatched_shapes() -> None:
    from nebula_mq.models.probe import train_linear_head

    with pytest.raises(DataError):
        train_linear_head(np.zeros((4, 3), np.float32), np.zeros(5, np.int64), 2)


def _settings(tmp_path: Path, data: str) -> Settings:
    return Settings(job=JobSettings(id="probe", scenario="electra", seed=1, steps=10, run_dir=str(tmp_path)),
                    electra={"data": data, "n_sub": 1, "model": {"preset": "tiny"}})


@pytest.mark.paddle
def test_run_side_errors_are_typed(tmp_path: Path) -> None:
    from workers.electra.probe import build_encoder, discriminator_tensors

    with pytest.raises(CheckpointError, match="no discriminator checkpoint"):
        discriminator_tensors(_settings(tmp_path, "corpus"))
    with pytest.raises(ConfigError, match="corpus"):
        build_encoder("random", _settings(tmp_path, "synthetic"), ["a"])
    with pytest.raises(ConfigError, match="encoder"):
        build_encoder("bert-large", _settings(tmp_path, "synthetic"), ["a"])
