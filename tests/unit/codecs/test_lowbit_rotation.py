"""``int3``, ``int2`` and ``hadamard``: the bit layout, the rotation's matrix and what it is for,
and the typed refusal of every forged node (the grid in test_codec_properties.py covers the
round trips and error bounds)."""

from __future__ import annotations

import numpy as np
import pytest

from nebula_mq.codecs import Encoded, Hadamard, Int2, Int3, decode_tree, parse_codec
from nebula_mq.codecs import hadamard
from nebula_mq.codecs.hadamard import signs, walsh_hadamard
from nebula_mq.errors import CodecError
from tests.fixtures.refusals import assert_decode_refused


def test_int3_packs_three_bits_a_value_low_bit_first() -> None:
    x = np.array([3.0, -3.0, 1.0, 0.0, -1.0, 2.0, 1.4, -0.2], np.float32)  # one block of 8: scale 1
    enc = Int3(block=8).encode(x)
    packed, scale = enc.leaves()
    assert scale.tolist() == [1.0] and packed.dtype == np.uint8 and packed.shape == (3,)
    codes = [6, 0, 4, 3, 2, 5, 4, 3]  # level + 3
    bits = "".join(format(c, "03b")[::-1] for c in codes)  # each code's low bit first
    assert packed.tolist() == [int(bits[i:i + 8][::-1], 2) for i in (0, 8, 16)]
    assert decode_tree(enc).tolist() == [3.0, -3.0, 1.0, 0.0, -1.0, 2.0, 1.0, -0.0]
    assert Int3().estimated_ratio((64, 384), "float32") == pytest.approx(3.25 / 32)


def test_int2_is_ternary_at_the_block_maximum() -> None:
    x = np.array([0.9, -0.9, 0.3, -0.5, 0.0, 0.45, -0.46, 0.2], np.float32)
    y = decode_tree(Int2(block=8).encode(x))
    assert y.tolist() == pytest.approx([0.9, -0.9, 0.0, -0.9, 0.0, 0.0, -0.9, 0.0])
    assert Int2().estimated_ratio((64, 384), "float32") == pytest.approx(2.25 / 32)


@pytest.mark.parametrize("codec", [Int3(block=8), Int2(block=8)])
@pytest.mark.parametrize("blocks", [1, 2, 7])
def test_lowbit_bytes_are_the_little_endian_bit_stream_of_the_codes(codec: Int3 | Int2, blocks: int) -> None:
    """The wire format: code i's bit j is bit bits x i + j of the stream, least significant first."""
    x = np.random.default_rng(blocks).standard_normal(8 * blocks).astype(np.float32)
    packed, scale = codec.encode(x).leaves()
    inv = np.float32(1.0) / scale  # the codec's own arithmetic
    levels = np.clip(np.rint(x.reshape(blocks, 8) * inv[:, None]), -codec.levels, codec.levels).astype(int) + codec.levels
    planes = (levels.reshape(-1, 1) >> np.arange(codec.bits)) & 1
    assert packed.tolist() == np.packbits(planes.reshape(-1).astype(np.uint8), bitorder="little").tolist()


@pytest.mark.parametrize("block", [0, 12, 1 << 21])
def test_lowbit_blocks_are_whole_bytes(block: int) -> None:
    with pytest.raises(CodecError, match="multiple of 8"):
        Int3(block=block)


def test_the_rotation_is_orthonormal_and_fixed_by_its_seed() -> None:
    basis = np.eye(128)
    m = np.stack([Hadamard(block=128).encode(e).parts[0] for e in basis])  # type: ignore[misc]
    assert np.allclose(m @ m.T, basis, atol=1e-12)
    assert np.allclose(np.abs(m), 1 / np.sqrt(128), atol=1e-15)
    # The same signs on every numpy (PCG64's raw stream), so both ends build the same rotation.
    assert signs(8, 0).tolist() == [-1, -1, 1, -1, -1, 1, -1, -1]
    assert signs(16, 0).tolist() == [-1, -1, 1, -1, -1, 1, -1, -1, -1, -1, 1, 1, 1, -1, -1, 1]
    assert signs(8, 1).tolist() != signs(8, 0).tolist()


def _sylvester(block: int) -> np.ndarray:
    h = np.ones((1, 1))
    while len(h) < block:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("chunk", [1, 4, 8, hadamard.CHUNK_ELEMS])
@pytest.mark.parametrize(("rows", "block"), [(5, 64), (300, 64), (3, 2), (0, 16), (2, 256)])
def test_the_fast_transform_is_the_sylvester_matrix(monkeypatch: pytest.MonkeyPatch, chunk: int, rows: int,
                                                    block: int) -> None:
    """Chunks of one row, of several, a shorter last one, blocks larger than a chunk."""
    monkeypatch.setattr(hadamard, "CHUNK_ELEMS", chunk)
    x = np.random.default_rng(rows).standard_normal((rows, block))
    y = walsh_hadamard(x.copy())
    assert y.shape == x.shape and np.allclose(y, x @ _sylvester(block).T, atol=1e-9)
    if rows:  # its own inverse up to 1/block, exactly so for integers
        ints = np.random.default_rng(1).integers(-9, 9, (rows, block)).astype(np.float64)
        assert np.array_equal(walsh_hadamard(walsh_hadamard(ints.copy())) / block, ints)


def test_a_block_larger_than_a_chunk_decodes_what_was_encoded() -> None:
    x = np.random.default_rng(4).standard_normal((3, 32768)).astype(np.float32)
    y = decode_tree(Hadamard(block=32768).encode(x))
    assert np.abs(y - x).max() <= 1e-5 * np.abs(x).max()


def test_rotating_first_cuts_int4s_error_where_one_channel_dominates() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 24, 256)).astype(np.float32)
    x[..., 5] *= 40.0  # an outlier channel, as transformer activations have

    def rel_error(spec: str) -> float:
        return float(np.linalg.norm(decode_tree(parse_codec(spec).encode(x)) - x) / np.linalg.norm(x))

    plain, rotated = rel_error("int4(block=64)"), rel_error("int4(hadamard(64), block=64)")
    assert rotated < plain / 2
    # The same bytes: the rotation's part is what int4 encodes, so nothing else travels.
    assert parse_codec("int4(hadamard(64), block=64)").encode(x).nbytes == parse_codec("int4(block=64)").encode(x).nbytes


def test_hadamard_refuses_values_whose_rotation_may_overflow() -> None:
    with pytest.raises(CodecError, match="may overflow float32"):
        Hadamard(block=16).encode(np.full(16, 1e38, np.float32))
    assert np.isfinite(decode_tree(Hadamard(block=16).encode(np.full(16, 1e37, np.float32)))).all()


@pytest.mark.parametrize("params", [{"block": 12}, {"block": 1 << 17}, {"block": 1}, {"seed": -1}])
def test_hadamard_parameters_are_checked(params: dict[str, int]) -> None:
    with pytest.raises(CodecError, match="hadamard"):
        Hadamard(**params)


FORGED = {
    "int3 code 7": Encoded(Int3.wire_id, {"block": 8}, (8,), "float32", (np.full(3, 0xFF, np.uint8), np.ones(1, np.float32))),
    "int3 scale is NaN": Encoded(Int3.wire_id, {"block": 8}, (8,), "float32",
                                 (np.zeros(3, np.uint8), np.array([np.nan], np.float32))),
    "int3 scale beyond 3 steps": Encoded(Int3.wire_id, {"block": 8}, (8,), "float32",
                                         (np.zeros(3, np.uint8), np.array([3e38], np.float32))),
    "int3 too few bytes": Encoded(Int3.wire_id, {"block": 8}, (8,), "float32", (np.zeros(2, np.uint8), np.ones(1, np.float32))),
    "int2 code 3": Encoded(Int2.wire_id, {"block": 8}, (8,), "float32", (np.full(2, 0xFF, np.uint8), np.ones(1, np.float32))),
    "int2 block 9": Encoded(Int2.wire_id, {"block": 9}, (9,), "float32", (np.zeros(3, np.uint8), np.ones(1, np.float32))),
    "hadamard part is Inf": Encoded(Hadamard.wire_id, {"block": 8, "seed": 0}, (8,), "float32",
                                    (np.array([np.inf] + [0.0] * 7, np.float32),)),
    "hadamard part overflows back": Encoded(Hadamard.wire_id, {"block": 8, "seed": 0}, (8,), "float32",
                                            (np.full(8, 3e38, np.float32),)),
    "hadamard part too short": Encoded(Hadamard.wire_id, {"block": 8, "seed": 0}, (8,), "float32", (np.zeros(7, np.float32),)),
    "hadamard part is float16": Encoded(Hadamard.wire_id, {"block": 8, "seed": 0}, (8,), "float32", (np.zeros(8, np.float16),)),
    "hadamard block 6": Encoded(Hadamard.wire_id, {"block": 6, "seed": 0}, (6,), "float32", (np.zeros(6, np.float32),)),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_nodes_are_refused_with_codec_errors(name: str) -> None:
    assert_decode_refused(FORGED[name])
