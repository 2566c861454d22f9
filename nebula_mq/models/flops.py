"""Floating-point operations of one ABNet training step on each side (paddle-free).

Counted as 2 FLOPs per multiply-add of every matrix product (linear layers,
attention scores and context, the output layer), for the work each worker
really does per micro-batch:

* **S**: the frozen layers below the lowest adapter run once, without autograd
  (their output is reused at apply time); the adapted layers run at send time,
  again at apply time (recompute), and backward: input gradients through every
  adapted layer, weight gradients for the adapters only (the rest is frozen).
* **T**: forward of every decoder layer and the output layer, then backward with
  input gradients everywhere (the gradient must reach the encoder output through
  the cross-attention of every adapted layer), weight gradients for the adapters
  and the LM-head transform; the output layer's matrix is frozen (tied embeddings).

Element-wise work (LayerNorm, softmax, GELU) is not counted: it is small beside
the products and is what a fast implementation hides.
"""

from __future__ import annotations

from dataclasses import dataclass

from nebula_mq.models.abnet_config import ABNetConfig, StackConfig


@dataclass(frozen=True)
class StepShape:
    batch: int
    source_len: int  # S, padded
    target_len: int  # T - 1 positions scored (BOS ... last token)
    output_vocab: int  # rows of the (pruned) output layer


def _layer_fwd(s: StackConfig, tokens: int, seq: int) -> float:
    """One frozen BERT layer over ``tokens`` positions of sequences of length ``seq``."""
    h = s.hidden
    return tokens * (2 * 4 * h * h + 2 * 2 * seq * h + 2 * 2 * h * s.ffn)


def _ffn_adapter(h: int, inner: int, tokens: int) -> float:
    return tokens * 2 * 2 * h * inner


def encoder_step_flops(cfg: ABNetConfig, shape: StepShape) -> float:
    e = cfg.encoder
    tokens, seq = shape.batch * shape.source_len, shape.source_len
    frozen = e.first_adapted * _layer_fwd(e, tokens, seq)
    adapted_layers = e.layers - e.first_adapted
    adapter = len(e.adapter_sites) * _ffn_adapter(e.hidden, cfg.adapter_hidden, tokens)
    adapted_fwd = adapted_layers * (_layer_fwd(e, tokens, seq) + adapter)
    # backward: input grads of everything adapted (1x) + weight grads of the adapters (1x more)
    adapted_bwd = adapted_layers * (_layer_fwd(e, tokens, seq) + 2 * adapter)
    return frozen + 2 * adapted_fwd + adapted_bwd


def decoder_step_flops(cfg: ABNetConfig, shape: StepShape) -> float:
    d, e = cfg.decoder, cfg.encoder
    tgt_tokens, src_tokens = shape.batch * shape.target_len, shape.batch * shape.source_len
    h = d.hidden
    cross = (tgt_tokens * (2 * 2 * h * h + 2 * 2 * shape.source_len * h)  # q, o; scores, context
             + src_tokens * 2 * 2 * h * e.hidden)  # k, v of the memory
    adapter = cross + _ffn_adapter(h, cfg.adapter_hidden, tgt_tokens)
    adapted = d.layers - d.first_adapted
    layers_fwd = d.layers * _layer_fwd(d, tgt_tokens, shape.target_len) + adapted * len(d.adapter_sites) * adapter
    head_transform = tgt_tokens * 2 * h * h
    logits = tgt_tokens * 2 * h * shape.output_vocab
    fwd = layers_fwd + head_transform + logits
    trainable = adapted * len(d.adapter_sites) * adapter + head_transform  # weight grads: 1x more
    return 2 * fwd + trainable


def matmul_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n
