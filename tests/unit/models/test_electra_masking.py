"""Masking, sampling and corruption (numpy parts of the ELECTRA step)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("paddle")

from nebula_mq.errors import ShapeMismatch  # noqa: E402
from nebula_mq.models.electra import (MaskedBatch, VocabSpec, corrupt, mask_batch,  # noqa: E402
                                      sample_from_logits)

pytestmark = pytest.mark.paddle

VOCAB = VocabSpec(size=200, pad_id=1, mask_id=4, special_ids=(0, 1, 2, 3, 4))


def _rows(rng: np.random.Generator, batch: int, seq: int) -> np.ndarray:
    ids = rng.integers(5, VOCAB.size, size=(batch, seq))
    lengths = rng.integers(4, seq + 1, size=batch)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, n - 1] = 0, 2
        ids[i, n:] = VOCAB.pad_id
    return ids


def test_masking_follows_80_10_10_and_selects_15_percent() -> None:
    rng = np.random.default_rng(0)
    ids = _rows(rng, 400, 64)
    mb = mask_batch(ids, rng, VOCAB, 0.15)
    maskable = (ids != VOCAB.pad_id) & ~np.isin(ids, VOCAB.special_ids)
    assert abs(mb.positions.sum() / maskable.sum() - 0.15) < 0.01
    chosen_in, chosen_orig = mb.masked_ids[mb.positions], ids[mb.positions]
    n = len(chosen_in)
    frac_mask = np.mean(chosen_in == VOCAB.mask_id)
    frac_kept = np.mean(chosen_in == chosen_orig)
    frac_random = 1.0 - frac_mask - frac_kept
    assert abs(frac_mask - 0.8) < 0.02, frac_mask
    # A random draw equal to the original counts as "kept": 10% + 10%/195 expected.
    assert abs(frac_kept - 0.1) < 0.015, frac_kept
    assert abs(frac_random - 0.1) < 0.015, frac_random
    assert n > 1000
    # Unselected tokens are untouched, labels are the originals.
    assert np.array_equal(mb.masked_ids[~mb.positions], ids[~mb.positions])
    assert np.array_equal(mb.labels, ids)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 6), seq=st.integers(4, 40),
       prob=st.floats(0.05, 0.5))
def test_specials_and_padding_are_never_masked_and_every_row_gets_a_position(
        seed: int, batch: int, seq: int, prob: float) -> None:
    rng = np.random.default_rng(seed)
    ids = _rows(rng, batch, seq)
    mb = mask_batch(ids, rng, VOCAB, prob)
    assert not mb.positions[np.isin(ids, VOCAB.special_ids)].any()
    maskable = ~np.isin(ids, VOCAB.special_ids)
    assert np.array_equal(mb.positions.any(axis=1), maskable.any(axis=1))
    # Random replacements never introduce special ids.
    random_cells = mb.positions & (mb.masked_ids != VOCAB.mask_id)
    assert not np.isin(mb.masked_ids[random_cells], VOCAB.special_ids).any()


def test_masking_is_a_function_of_the_seed() -> None:
    ids = _rows(np.random.default_rng(1), 8, 32)
    a = mask_batch(ids, np.random.default_rng([3, 4]), VOCAB)
    b = mask_batch(ids, np.random.default_rng([3, 4]), VOCAB)
    c = mask_batch(ids, np.random.default_rng([3, 5]), VOCAB)
    assert np.array_equal(a.masked_ids, b.masked_ids) and np.array_equal(a.positions, b.positions)
    assert not np.array_equal(a.positions, c.positions)


def test_replaced_mask_is_false_where_the_sample_equals_the_original() -> None:
    labels = np.array([[0, 10, 11, 12, 13, 2]], dtype=np.int32)
    positions = np.array([[False, True, True, False, True, False]])
    batch = MaskedBatch(masked_ids=np.where(positions, 4, labels).astype(np.int32), positions=positions,
                        labels=labels)
    corrupted, replaced = corrupt(batch, np.array([10, 99, 13], dtype=np.int32))  # 10 and 13 are the originals
    assert corrupted.tolist() == [[0, 10, 99, 12, 13, 2]]
    assert replaced.tolist() == [[0, 0, 1, 0, 0, 0]]


def test_sampling_follows_the_softmax_and_avoids_forbidden_ids() -> None:
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.0, 0.5, 0.3, 0.2]] * 20000) + 1e-30).astype(np.float32)
    logits[:, 0] = 50.0  # forbidden, would win every draw otherwise
    draws = sample_from_logits(logits, rng, forbidden=(0,))
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[0] == 0.0
    np.testing.assert_allclose(freq[1:], [0.5, 0.3, 0.2], atol=0.015)


def test_bad_shapes_raise_typed_errors() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ShapeMismatch):
        mask_batch(np.arange(10), rng, VOCAB)
    with pytest.raises(ShapeMismatch):
        mask_batch(np.ones((2, 5), dtype=np.int64) * 7, rng, VOCAB, attention_mask=np.ones((2, 4)))
