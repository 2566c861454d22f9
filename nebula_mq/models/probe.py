"""Cross-lingual transfer probe: a linear classifier on frozen, mean-pooled encoder states.

The head is trained on English only and scored on every language of a
:class:`~nebula_mq.data.probe.ProbeSet`. The encoder stays frozen so the
figure measures what the encoder's representation carries across languages,
not what a fine-tuned encoder can relearn from English alone.

Encoders are adapted behind one small ABC, :class:`SentenceEncoder`;
:class:`BertSentenceEncoder` covers every BERT-shaped encoder of the project
(the Scenario I discriminator, multilingual-e5-small, a random-init baseline),
given the function that maps texts to its own token ids.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import paddle
from paddle import nn

from nebula_mq.data.probe import ProbeSet
from nebula_mq.errors import DataError
from nebula_mq.models.bert import BertConfig, BertEncoder, load_numpy_state, mean_pool, padding_bias

# texts -> token-id rows (with the encoder's <s>/</s>), in the encoder's own vocabulary.
TokenIds = Callable[[Sequence[str]], list[list[int]]]


class SentenceEncoder(abc.ABC):
    """Extension point: texts -> one fixed-size vector per text."""

    @abc.abstractmethod
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), H] float32."""


class BertSentenceEncoder(SentenceEncoder):
    """Mean of a BERT encoder's last-layer token states over the non-padding tokens."""

    def __init__(self, encoder: BertEncoder, token_ids: TokenIds, pad_id: int, max_len: int = 64,
                 batch_size: int = 64) -> None:
        self.encoder, self.token_ids, self.pad_id = encoder, token_ids, pad_id
        self.max_len, self.batch_size = max_len, batch_size
        self.encoder.eval()

    @paddle.no_grad()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self.batch_size):
            rows = [r[: self.max_len] for r in self.token_ids(texts[i: i + self.batch_size])]
            ids = np.full((len(rows), max(map(len, rows))), self.pad_id, dtype=np.int64)
            mask = np.zeros(ids.shape, dtype=np.float32)
            for j, r in enumerate(rows):
                ids[j, : len(r)], mask[j, : len(r)] = r, 1.0
            m = paddle.to_tensor(mask)
            states = self.encoder(paddle.to_tensor(ids), padding_bias(m))
            out.append(mean_pool(states, m, normalize=False).numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


def bert_encoder(cfg: BertConfig, tensors: dict[str, np.ndarray] | None = None, seed: int = 0) -> BertEncoder:
    """A BertEncoder with ``tensors`` loaded (pretrained names), or BERT-style random init from ``seed``."""
    from nebula_mq.models.electra_trainers import init_bert_style

    encoder = BertEncoder(cfg)
    init_bert_style(encoder, seed)
    if tensors is not None:
        load_numpy_state(encoder, tensors)
    return encoder


@dataclass(frozen=True)
class TransferResult:
    """Accuracy of the English-trained head on each language's held-out strings."""

    accuracy: dict[str, float]  # language -> accuracy on its held-out strings
    train_accuracy: float  # on the English training strings (a head that cannot fit them says little)
    chance: float  # majority-class accuracy of the held-out labels
    classes: tuple[str, ...]

    def mean_transfer(self, source: str = "en") -> float:
        """Mean accuracy over the languages other than ``source``."""
        others = [a for lang, a in self.accuracy.items() if lang != source]
        return float(np.mean(others)) if others else float("nan")


def train_linear_head(features: np.ndarray, labels: np.ndarray, n_classes: int, *, epochs: int = 300,
                      lr: float = 0.01, weight_decay: float = 1e-3, seed: int = 0) -> nn.Linear:
    """Full-batch multinomial logistic regression (AdamW) on standardised features."""
    if features.ndim != 2 or len(features) != len(labels) or len(features) == 0:
        raise DataError(f"features {features.shape} and labels {labels.shape} do not match")
    paddle.seed(seed)
    head = nn.Linear(features.shape[1], n_classes)
    opt = paddle.optimizer.AdamW(learning_rate=lr, parameters=head.parameters(), weight_decay=weight_decay)
    x, y = paddle.to_tensor(features), paddle.to_tensor(labels.astype(np.int64))
    for _ in range(epochs):
        loss = nn.functional.cross_entropy(head(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    return head


def evaluate_transfer(encoder: SentenceEncoder, probe: ProbeSet, *, epochs: int = 300, seed: int = 0) -> TransferResult:
    """Train a linear head on ``probe``'s English strings, score it on every language."""
    train = encoder.encode(list(probe.train_texts))
    # Standardise with the English training statistics only: the test languages
    # must not leak into the classifier (a language's own centring is adaptation).
    mu, sd = train.mean(axis=0), train.std(axis=0) + 1e-6
    head = train_linear_head((train - mu) / sd, probe.train_labels, len(probe.classes), epochs=epochs, seed=seed)

    def accuracy(feats: np.ndarray, labels: np.ndarray) -> float:
        with paddle.no_grad():
            pred = head(paddle.to_tensor(((feats - mu) / sd).astype(np.float32))).numpy().argmax(axis=1)
        return float((pred == labels).mean())

    acc = {lang: accuracy(encoder.encode(list(texts)), probe.test_labels) for lang, texts in probe.test_texts.items()}
    chance = float(np.bincount(probe.test_labels).max() / len(probe.test_labels))
    return TransferResult(acc, accuracy(train, probe.train_labels), chance, probe.classes)


def xlmr_token_ids(old_to_new: Callable[[np.ndarray], np.ndarray] | None = None) -> TokenIds:
    """XLM-R tokenisation (``<s> … </s>``), optionally mapped into a pruned vocabulary."""
    from nebula_mq.data.tokenizers import load_xlmr_tokenizer

    tok = load_xlmr_tokenizer()

    def ids(texts: Sequence[str]) -> list[list[int]]:
        rows = [e.ids for e in tok.encode_batch(list(texts))]
        return rows if old_to_new is None else [old_to_new(np.asarray(r, dtype=np.int64)).tolist() for r in rows]

    return ids


def e5_small_encoder(texts: Sequence[str], layers: int | None = None) -> BertSentenceEncoder:
    """multilingual-e5-small, its vocabulary pruned to the XLM-R pieces of ``texts``."""
    from nebula_mq.models.pretrained import load_e5_small

    full = xlmr_token_ids()
    keep = np.unique(np.concatenate([np.asarray(r, dtype=np.int64) for r in full(texts)]))
    weights = load_e5_small(keep_ids=keep, layers=layers)
    if weights.vocab is None:
        raise DataError("e5-small loader returned an unpruned vocabulary")
    vocab = weights.vocab
    encoder = bert_encoder(weights.shape, weights.tensors)
    pad = int(vocab.old_to_new(np.array([weights.special_ids["pad"]]))[0])
    return BertSentenceEncoder(encoder, xlmr_token_ids(vocab.old_to_new), pad)
