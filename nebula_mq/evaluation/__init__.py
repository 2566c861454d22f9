"""Scoring translations: sacrebleu BLEU and chrF per domain, detokenizers, paired bootstrap."""
