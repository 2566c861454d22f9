"""examples/split_langid (a byte-level transformer cut in two that tells a string's language),
on a tiny in-memory set of strings: the split, the one-line error, the shapes, the determinism
of ``inputs(mb)``, and a pair built from a job file, trained over the in-memory transport,
that lowers its loss and whose checkpoints evaluate.py scores above the baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import DataError
from nebula_mq.settings import Settings, load_settings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from tests.fixtures.pairs import drivers
from tests.fixtures.threads import history, run_workers

torch = pytest.importorskip("torch")
from tests.fixtures.langid import WORDS, evaluate  # noqa: E402  (after torch)
import langid_data  # noqa: E402
import langid_model  # noqa: E402
BATCH = 8


def texts(per_language: int = 40, shared: str = "GNOME") -> dict[str, list[str]]:
    """Strings of three or four words per language, and one string every language shares."""
    rng = np.random.default_rng(0)
    return {lang: [" ".join(rng.choice(words, size=3 + i % 2)) for i in range(per_language)] + [shared]
            for lang, words in WORDS.items()}


@pytest.fixture(scope="module")
def data() -> langid_data.LangData:
    return langid_data.split(texts(), per_language=32, held_out=8)


def test_the_split_labels_holds_out_and_drops_strings_of_several_languages(data: langid_data.LangData) -> None:
    assert data.languages == ("de", "es", "ru")
    assert data.train_bytes.shape == (len(data.train_labels), langid_data.MAX_BYTES)
    assert data.train_bytes.dtype == data.train_labels.dtype == np.int64
    assert np.bincount(data.test_labels).tolist() == [8, 8, 8]
    assert set(map(bytes, data.train_bytes.astype(np.uint8))).isdisjoint(map(bytes, data.test_bytes.astype(np.uint8)))
    gnome = langid_data.encode(["GNOME"])[0]
    assert not (data.train_bytes == gnome).all(axis=1).any()
    assert data.baseline() == pytest.approx((np.log(3), 1 / 3))
    again = langid_data.split(texts(), per_language=32, held_out=8)
    assert np.array_equal(again.train_bytes, data.train_bytes) and np.array_equal(again.test_labels, data.test_labels)


def test_bytes_are_shifted_cut_and_padded() -> None:
    row = langid_data.encode(["añ"], max_bytes=6)[0]
    assert row.tolist() == [ord("a") + 1, 0xC3 + 1, 0xB1 + 1, 0, 0, 0]
    assert langid_data.encode(["x" * 100]).shape == (1, langid_data.MAX_BYTES)


def test_fewer_than_two_languages_is_a_one_line_data_error() -> None:
    with pytest.raises(DataError, match="at least 2 languages, found \\['de'\\]") as one:
        langid_data.split({"de": ["Datei öffnen", "Fehler"]})
    assert "\n" not in str(one.value)
    with pytest.raises(DataError, match="found none"):
        langid_data.split(langid_data.read_texts(["xx"]))  # no catalogue of language "xx"


def test_inputs_are_deterministic_and_the_halves_fit(data: langid_data.LangData) -> None:
    head = langid_model.build_head(None, data, batch=BATCH)
    ids, x = head.inputs(5)
    again = head.inputs(5)
    assert np.array_equal(ids, again[0]) and np.array_equal(x, again[1])
    assert ids.dtype == np.int64 and x.shape == (BATCH, langid_data.MAX_BYTES)
    assert not np.array_equal(ids, head.inputs(6)[0])
    tail = langid_model.build_tail(None, data)
    assert np.array_equal(tail.targets(ids), data.train_labels[ids])
    activation = head.model(torch.from_numpy(x))
    assert activation.shape == (BATCH, langid_data.MAX_BYTES, langid_model.WIDTH)
    assert tail.model(activation).shape == (BATCH, len(data.languages))


JOB = """\
[job]
id = "unit-langid"
scenario = "split"
seed = 7
steps = 40
run_dir = "{run_dir}"

[codec]
forward = "fp16"
backward = "int8"
compress_from_step = 0

[split]
head = "langid_model:build_head"
tail = "langid_model:build_tail"
head_cluster = "s"
tail_cluster = "t"
in_flight = 2
checkpoint_every = 20
lr = 0.003
"""


def run_pair(settings: Settings) -> None:
    """The job's head and tail, each in its own thread over one in-memory broker."""
    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    def transport(cluster: str) -> MemoryTransport:
        return MemoryTransport(broker, settings.transport, settings.job.id, cluster)

    broker = MemoryBroker()
    tail = SpecTail(settings, langid_model.build_tail(settings), SpecTail.identity(settings).worker(transport("t")))
    head = SpecHead(settings, langid_model.build_head(settings), SpecHead.identity(settings).worker(transport("s")))
    run_workers(drivers(tail, head))  # the tail declares its queues first


def test_a_pair_trains_compressed_and_evaluate_scores_its_checkpoints(
        tmp_path: Path, data: langid_data.LangData, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for module in (langid_model, evaluate):  # the tiny strings, not the host's catalogues
        monkeypatch.setattr(module, "dataset", lambda: data)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run"))
    run_pair(load_settings(job))
    curve = history(tmp_path / "run", "tail-0", "loss")
    assert len(curve) == 40 and np.mean(curve[-8:]) < 0.7 * np.mean(curve[:8])
    assert evaluate.main([str(job)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint: step 40 of both sides" in out and "baseline ln 3 = 1.099" in out
    loss = float(out.split("held-out loss ")[1].split()[0])
    accuracy = float(out.split("held-out accuracy ")[1].split()[0])
    assert loss < np.log(3) and accuracy > 0.5
