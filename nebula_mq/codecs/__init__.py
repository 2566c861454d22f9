"""Tensor codecs (pure numpy): quantisation, low-rank, sparsification, lossless.

``parse_codec("fp16(svd(0.6))")`` builds a codec from a config string;
``codec.encode(x) -> Encoded``; :func:`decode_tree` decodes any tree.
Importing this package registers every concrete codec by wire id and name.
"""

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, codec_class, registered
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.codecs.cast import BF16, FP16, LZ4, Identity
from nebula_mq.codecs.compose import ByRole, BySize, Chain
from nebula_mq.codecs.flow import CompressionSchedule
from nebula_mq.codecs.hadamard import Hadamard
from nebula_mq.codecs.lowrank import SVD, LowRankState, PowerSGD, RandomizedSVD
from nebula_mq.codecs.parse import parse_codec
from nebula_mq.codecs.quantise import Int2, Int3, Int4, Int8
from nebula_mq.codecs.sparse import TopK

__all__ = [
    "BF16", "FP16", "LZ4", "SVD", "ByRole", "BySize", "Chain", "Codec", "CompressionSchedule",
    "EncodeContext", "Encoded", "Hadamard", "Identity", "Int2", "Int3", "Int4", "Int8", "LowRankState", "PowerSGD",
    "RandomizedSVD", "TopK",
    "codec_class", "decode_tree", "parse_codec", "registered",
]
