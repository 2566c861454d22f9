"""ABNet on pretrained weights and real text (issue: Scenario II must learn on real data).

Real gettext translations (``real_corpus``), e5-small on S and MiniLM on T, each cut
to two layers so a CPU runs these in seconds. What they pin down:

* the joint model memorises a small real sample: near-zero loss, each pair's own
  reference back under beam search, and the loss rises when the sources are shuffled
  against the targets (the decoder uses the source);
* the encoder does not collapse: after training its outputs still differ between
  tokens and between sentences;
* the split job (two workers, messages in between) equals the joint model at
  ``in_flight = 1`` without compression;
* ``nebula-mq eval`` scores a trained job on text files and refuses bad ones.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("paddle")

from nebula_mq.settings import CodecSettings, JobSettings, Settings, TransportSettings  # noqa: E402
from nebula_mq.transport.memory import MemoryBroker  # noqa: E402
from tests.fixtures.pairs import drivers, memory_worker, CLUSTERS_ST  # noqa: E402
from tests.fixtures.threads import history, run_workers  # noqa: E402

pytestmark = pytest.mark.paddle

LAYERS = {"encoder_layers": 2, "decoder_layers": 2}
MAX_STEPS, FITTED = 400, 0.01  # full-batch steps to memorise 32 pairs: until the loss is below FITTED


def corpus_job(data_dir: Path, **over: object) -> object:
    from workers.abnet.job import AbnetJob

    return AbnetJob(**{"preset": "small", **LAYERS, "data": "corpus", "data_dir": str(data_dir), **over})  # type: ignore[arg-type]


def joint_model(job: object, seed: int) -> object:
    from nebula_mq.models.abnet import ABNet
    from workers.abnet.job import load_side, model_config, target_keep_ids

    cfg = model_config(job, seed)  # type: ignore[arg-type]
    train_tgt = load_side(job, seed, "tgt", cfg.decoder.vocab)  # type: ignore[arg-type]
    return ABNet(cfg, tgt_keep_ids=target_keep_ids(job, train_tgt))  # type: ignore[arg-type]


def test_joint_model_memorises_real_pairs_uses_the_source_and_keeps_tokens_apart(real_corpus: Path) -> None:
    import paddle

    from workers.abnet.job import load_side

    job = corpus_job(real_corpus, batch_size=32, train_samples=0)
    src_side, tgt_side = load_side(job, 0, "src", 250037), load_side(job, 0, "tgt", 30522)  # type: ignore[arg-type]
    short = np.nonzero((tgt_side.arrays["tgt_mask"].sum(1) <= 10) & (src_side.arrays["src_mask"].sum(1) <= 12))[0]
    rows = short[:32]
    ids, src, mask = src_side.source_rows(rows)
    tgt = tgt_side.targets(ids)
    model = joint_model(job, seed=0)
    model.decoder.cfg = dataclasses.replace(model.decoder.cfg, label_smoothing=0.0)  # exact memorisation
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.trainable_parameters(), weight_decay=0.0)
    first = None
    for step in range(MAX_STEPS):
        opt.set_lr(2e-3 * min(1.0, (step + 1) / 10))
        loss = model.loss(src, mask, tgt)
        first = float(loss) if first is None else first
        if float(loss) < FITTED:
            break
        loss.backward()
        opt.step()
        opt.clear_grad()
    model.eval()
    with paddle.no_grad():
        fitted = float(model.loss(src, mask, tgt))
        shuffled = float(model.loss(src[np.roll(np.arange(len(rows)), 1)], mask[np.roll(np.arange(len(rows)), 1)], tgt))
        enc = model.encoder(src, mask).numpy()
    assert first > 8 and fitted < FITTED, (first, fitted, step)
    assert shuffled > fitted + 2.0  # another sentence's source does not explain this target
    # Beam search gives back each pair's own reference, token for token.
    hyps = model.translate(src, mask, beam=4, max_len=16)
    refs = [[int(t) for t in row if t not in (0, 101, 102)] for row in tgt]
    assert hyps == refs
    # No collapse: tokens of a sentence, and sentences, stay apart.
    tokens = enc[mask > 0]  # [N, H]
    assert tokens.std(axis=0).mean() > 0.1
    pooled = (enc * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    dist = np.linalg.norm(pooled[:, None] - pooled[None], axis=-1)
    assert dist[~np.eye(len(pooled), dtype=bool)].min() > 1e-2


def test_unseen_words_reach_the_encoder_as_the_pretrained_tokenizer_sees_them(real_corpus: Path) -> None:
    import paddle

    from nebula_mq.data.tokenizers import load_xlmr_tokenizer

    model = joint_model(corpus_job(real_corpus), seed=0)
    assert model.encoder.vocab is None  # the full e5 vocabulary: nothing is mapped to <unk>
    tok = load_xlmr_tokenizer()
    a, b = tok.encode("数据库连接失败").ids, tok.encode("ホームディレクトリが見つかりません").ids
    assert 3 not in a and 3 not in b  # XLM-R's <unk>
    width = max(len(a), len(b))
    src = np.array([a + [1] * (width - len(a)), b + [1] * (width - len(b))])
    mask = (np.arange(width)[None] < np.array([[len(a)], [len(b)]])).astype(np.float32)
    model.eval()
    with paddle.no_grad():
        out = model.encoder(src, mask).numpy()
    assert np.abs(out[0, : len(a)].mean(0) - out[1, : len(b)].mean(0)).max() > 1e-2


def split_settings(real_corpus: Path, run_dir: Path, steps: int) -> Settings:
    return Settings(
        job=JobSettings(id="unit-abnet-real", scenario="abnet", seed=5, steps=steps, run_dir=str(run_dir)),
        codec=CodecSettings(forward="none", backward="none"),
        transport=TransportSettings(publish_patience_s=30.0),
        abnet={"preset": "small", **LAYERS, **CLUSTERS_ST, "data": "corpus", "data_dir": str(real_corpus), "batch_size": 8,
               "in_flight": 1, "lr": 1e-3, "warmup_steps": 3, "lr_decay": "cosine", "checkpoint_every": 3},
    )


@pytest.fixture(scope="module")
def trained_split_job(real_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Six steps of the real split job (encoder and decoder workers, in-memory broker)."""
    from workers.abnet.decoder import AbnetDecoder
    from workers.abnet.encoder import AbnetEncoder

    settings = split_settings(real_corpus, tmp_path_factory.mktemp("split-real"), steps=6)
    broker = MemoryBroker()
    enc = AbnetEncoder(settings, memory_worker(AbnetEncoder.identity(settings), broker))
    dec = AbnetDecoder(settings, memory_worker(AbnetDecoder.identity(settings), broker))
    run_workers(drivers(dec, enc), timeout=300)
    return settings


def test_split_job_equals_the_joint_model_at_one_in_flight(trained_split_job: Settings) -> None:
    import paddle

    from workers.abnet.job import adapter_optimizer, learning_rate, load_job, load_side

    settings = trained_split_job
    job = load_job(settings)
    seed = settings.job.seed
    model = joint_model(job, seed)
    src_side, tgt_side = load_side(job, seed, "src", 250037), load_side(job, seed, "tgt", 30522)
    # One optimizer per side, each clipping its own gradients, as the two workers do.
    optimizers = [adapter_optimizer(job, half.trainable_parameters()) for half in (model.encoder, model.decoder)]
    expected = []
    for mb in range(settings.job.steps):
        ids, src, mask = src_side.source(mb)
        loss = model.loss(src, mask, tgt_side.targets(ids))
        loss.backward()
        for opt in optimizers:
            opt.set_lr(learning_rate(job, settings.job.steps, mb))
            opt.step()
            opt.clear_grad()
        expected.append(float(loss))
    split = history(settings.run_dir, "dec-0", "loss")
    np.testing.assert_allclose(split, expected, rtol=2e-5)
    assert expected[-1] < expected[0]


def _job_file(settings: Settings, where: Path) -> Path:
    ab = settings.section("abnet")
    body = (f'[job]\nid = "{settings.job.id}"\nscenario = "abnet"\nseed = {settings.job.seed}\n'
            f'steps = {settings.job.steps}\nrun_dir = "{settings.run_dir}"\n\n'
            f'[codec]\nforward = "fp16"\nbackward = "none"\n\n[abnet]\n'
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ab.items()))
    path = where / "job.toml"
    path.write_text(body)
    return path


def test_eval_command_translates_and_scores_text_files(trained_split_job: Settings, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    job = _job_file(trained_split_job, tmp_path)
    src, ref = tmp_path / "in.es", tmp_path / "in.en"
    src.write_text("Abrir el archivo\nNo se puede leer el disco\n数据库连接失败\n", encoding="utf-8")
    ref.write_text("Open the file\nCannot read the disk\nDatabase connection failed\n", encoding="utf-8")
    out = tmp_path / "out.hyp"
    assert main(["eval", str(job), "--src", str(src), "--ref", str(ref), "--out", str(out), "--beam", "2",
                 "--max-len", "8"]) == 0
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "chrF" in printed
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    scores = json.loads((trained_split_job.run_dir / "eval-in.es.json").read_text())
    assert 0.0 <= scores["bleu"] <= 100.0 and 0.0 <= scores["chrf"] <= 100.0
    assert scores["references"][2] == "Database connection failed" and scores["samples"] == 3


@pytest.mark.parametrize("case, expected", [
    ("mismatch", "has 2 lines but"),
    ("empty", "is empty"),
    ("latin1", "is not UTF-8 (line 2"),
    ("directory", "is a directory"),
    ("missing", "cannot read source file"),
])
def test_eval_command_refuses_bad_files_in_one_line(trained_split_job: Settings, tmp_path: Path, case: str,
                                                    expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    job = _job_file(trained_split_job, tmp_path)
    src, ref = tmp_path / "in.es", tmp_path / "in.en"
    src.write_text("Abrir el archivo\nGuardar\n", encoding="utf-8")
    ref.write_text("Open the file\nSave\n", encoding="utf-8")
    if case == "mismatch":
        ref.write_text("Open the file\nSave\nClose\n", encoding="utf-8")
    elif case == "empty":
        ref.write_text("\n\n", encoding="utf-8")
    elif case == "latin1":
        src.write_bytes("Abrir el archivo\nGuardar cambios en el búfer\n".encode("latin-1"))
    elif case == "directory":
        src.unlink()
        src.mkdir()
    elif case == "missing":
        src.unlink()
    assert main(["eval", str(job), "--src", str(src), "--ref", str(ref)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nebula-mq: error:") and expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
