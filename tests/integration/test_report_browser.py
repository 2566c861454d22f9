"""``nebula-mq report`` end to end, checked in a real (headless) browser.

The run directory is produced the way a job produces it: two workers built on
the real ``Worker`` base exchange real envelopes (fp16 activations, int8
gradient replies) through ``Outbox``/``Inbox`` over the in-process transport,
so MetricsHook counts real raw and wire bytes, a corrupted message is really
dead-lettered and a re-published one really discarded as a duplicate; they
checkpoint, write status and history, and the encoder is restarted mid-run.
Only the clock is virtual (so 150 steps span minutes, not milliseconds).

Needs Chromium: ``apt-get install -y --no-install-recommends chromium``.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from nebula_mq import topology
from nebula_mq.codecs import parse_codec
from nebula_mq.runtime import metrics as metrics_module
from nebula_mq.runtime import reporter as reporter_module
from nebula_mq.runtime.channel import Inbox, Outbox
from nebula_mq.runtime.worker import Worker
from workers.base import WorkerIdentity
from nebula_mq.settings import JobSettings, Settings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (apt-get install -y --no-install-recommends chromium)")

STEPS, RESTART_AT, CUT_AT, CUT_S, EVERY = 150, 90, 60, 12.0, 10


class VirtualClock:
    """Stands in for ``time`` in the worker and metrics modules: timestamps only."""

    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        return self.now


def build_run_dir(run_dir: Path, clock: VirtualClock) -> None:
    settings = Settings(job=JobSettings(id="report-demo", scenario="abnet", steps=STEPS, run_dir=str(run_dir)))
    act, reply = topology.abnet_flows("s", "t", ("enc-s0",))
    broker = MemoryBroker()
    rng = np.random.default_rng(7)
    fp16, int8 = parse_codec("fp16"), parse_codec("int8")

    # Workers whose steps the test drives itself (both sides in one thread).
    def encoder() -> tuple[Worker, Outbox, Inbox]:
        enc = WorkerIdentity(settings, "s", "enc-s0", "abnet-encoder", EVERY).worker(
            MemoryTransport(broker, settings.transport, "report-demo", "s"))
        enc.transport.declare_dead_letter_queue()
        enc.transport.declare_flow(act, "producer")
        enc.transport.declare_flow(reply, "consumer")
        return enc, Outbox(enc, act, "enc-s0"), Inbox(enc, reply, held=EVERY + 1)

    enc, enc_out, enc_in = encoder()
    dec = WorkerIdentity(settings, "t", "dec-t0", "abnet-decoder", EVERY).worker(
        MemoryTransport(broker, settings.transport, "report-demo", "t"))
    dec.transport.declare_dead_letter_queue()
    dec.transport.declare_flow(act, "consumer")
    reply_queue = dec.transport.declare_flow(reply, "producer")
    dec_out, dec_in = Outbox(dec, reply, "dec-t0"), Inbox(dec, act, held=EVERY + 1)
    weights = {"w": np.zeros(8, np.float32)}
    for w in (enc, dec):
        w.report.status("running")
    step = 0
    while step < STEPS:
        if step == RESTART_AT:  # SIGTERM: checkpoint, stop; a new process resumes there
            enc.commit(weights, {}), enc.report.write_history(), enc.report.status("stopped")
            enc_in.close(), enc_out.close()
            clock.now += 20.0
            enc, enc_out, enc_in = encoder()
            enc.step = enc.store.latest().step
        if step == CUT_AT:  # the WAN is cut: the decoder waits until it heals
            clock.now += CUT_S
            dec.hooks.on_wait(CUT_S)
        activations = rng.standard_normal((16, 24, 64)).astype(np.float32)
        clock.now += 0.35 + 0.1 * rng.random()
        enc.hooks.on_compute(0.3)
        enc_out.send(step=step, micro_batch=step, tensors={"enc_out": (activations, fp16)}, reply_to=reply_queue)
        got = dec_in.get(timeout=1)
        while got is not None and got.micro_batch < step:  # a repeat, as the ordered inbox drops it
            dec_in.discard_duplicate(got)
            got = dec_in.get(timeout=1)
        assert got is not None and got.micro_batch == step
        clock.now += 0.5 + 0.1 * rng.random()
        dec.hooks.on_wait(0.35)
        dec.hooks.on_compute(0.45)
        loss = 6.0 * math.exp(-step / 45) + 1.2 + 0.15 * rng.standard_normal()
        dec_out.send(step=step, micro_batch=step, tensors={"grad": (activations * 1e-3, int8)},
                     meta={"loss": loss})  # the reply flow's queue: reply_queue
        dec_in.applied(got)
        back = enc_in.get(timeout=1)
        assert back is not None
        enc_in.applied(back)
        enc.hooks.on_wait(0.5)
        step += 1
        for w, values in ((enc, {"loss": back.meta["loss"]}), (dec, {"loss": loss, "lr": 1e-3 * min(1, step / 20)})):
            w.step = step
            w.record_step(values)
            if step % EVERY == 0:
                w.commit(weights, {})
                w.report.write_history()
                w.sampler.sample()  # on this thread, at the virtual clock's time: no sampler thread runs here
        if step == 40:  # a lost ack: the activation is delivered again and must be dropped
            dec.transport.publisher().publish(dec.transport.queue_for(act), _last_body(enc_out, act, step - 1),
                                              "again")
        if step == 100:  # a corrupted message is dead-lettered with its reason
            dec.transport.publisher().publish(dec.transport.queue_for(act), b"\x00not an envelope", "junk")
    assert dec_in.get(timeout=0.1) is None  # drains the duplicate and the junk: both handled, none returned
    for w in (enc, dec):
        w.commit(weights, {}), w.report.write_history(), w.report.metrics.flush(), w.report.status("finished")
    (run_dir / "faults.jsonl").write_text(json.dumps(
        {"time": _row_time(run_dir, "dec-t0", CUT_AT + 1) - CUT_S, "kind": "wan_cut", "target": "s<->t",
         "recovered_after_s": CUT_S}) + "\n")
    (run_dir / "bench").mkdir()  # the shape `nebula-mq bench codecs --json-out` writes
    (run_dir / "bench" / "codecs.json").write_text(json.dumps({
        "machine": {"cpu": "synthetic", "cores": 2},
        "codecs": [{"input": "act 16x24x64", "codec": c, "ratio": r, "rel_err": err, "encode_MBps": mbps,
                    "decode_MBps": 2 * mbps} for c, r, err, mbps in
                   (("fp16", 0.5, 2e-4, 900.0), ("int8", 0.25, 4e-3, 610.0), ("fp16(svd(0.6))", 0.13, 0.21, 55.0))],
        "lowrank": []}))
    (run_dir / "study").mkdir()
    (run_dir / "study" / "abnet.json").write_text(json.dumps([
        {"chain": "none", "bleu": 24.1, "forward_ratio": 1.0, "backward_ratio": 1.0, "s_per_step": 2.9},
        {"chain": "fp16", "bleu": 24.0, "forward_ratio": 2.0, "backward_ratio": 2.0, "s_per_step": 1.6},
        {"chain": "fp16(svd(0.6))", "bleu": 23.2, "forward_ratio": 7.9, "backward_ratio": 3.9, "s_per_step": 0.9},
    ]))


def _last_body(outbox: Outbox, flow: topology.Flow, micro_batch: int) -> bytes:
    """An earlier micro-batch's envelope again (same message id), as a producer that
    recomputed it after losing the confirm would send it."""
    from nebula_mq.wire import Envelope, encode_envelope, pack_tensors

    arr = np.ones((16, 24, 64), np.float32)
    records = pack_tensors({"enc_out": arr}, {"enc_out": parse_codec("fp16")})
    return encode_envelope(Envelope("report-demo", flow.name, micro_batch, micro_batch, micro_batch,
                                    outbox.producer_id, records, {}),
                           signer=outbox.worker.auth.signer())  # signed: a true duplicate, not a forgery


def _row_time(run_dir: Path, worker: str, step: int) -> float:
    for line in (run_dir / "history" / f"{worker}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == step:
            return float(row["time"])
    raise AssertionError(f"no history row for step {step}")


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    clock = VirtualClock(1_760_000_000.0)
    fake_time = types.SimpleNamespace(time=clock.time, monotonic=clock.time)  # both clocks virtual
    monkeypatch.setattr(reporter_module, "time", fake_time)
    monkeypatch.setattr(metrics_module, "time", fake_time)
    root = tmp_path / "run"
    build_run_dir(root, clock)
    return root


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", *args],
                          capture_output=True, text=True, timeout=timeout)


@needs_chromium
def test_report_renders_in_a_browser_with_all_figures(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    cli = subprocess.run([sys.executable, "-m", "nebula_mq", "report", str(run_dir), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    page = out / "report.html"
    assert cli.stdout.strip() == str(page)
    source = page.read_text()
    # Offline: nothing is fetched from anywhere (no http(s) src/href, no @import).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", source)
    assert "@import" not in source and "url(http" not in source

    dom = chromium(f"--user-data-dir={tmp_path / 'profile-dom'}", "--virtual-time-budget=10000",
                   "--dump-dom", page.as_uri()).stdout
    # The page's own script recorded how many figures decoded, and each one's size.
    figures = re.search(r'<html[^>]*data-figures="(\d+)/(\d+)"', dom)
    assert figures is not None, dom[:500]
    loaded, total = map(int, figures.groups())
    assert total == 6 and loaded == total  # training, throughput, link, queues, compute/wait, study
    from PIL import Image

    for src, natural in re.findall(r'<img src="data:image/png;base64,([^"]+)"[^>]*data-natural="(\d+x\d+)"', dom):
        with Image.open(io.BytesIO(base64.b64decode(src))) as im:
            assert natural == f"{im.width}x{im.height}"
    assert len(re.findall(r"data-natural=", dom)) == total
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "compute_wait.png", "link.png", "queues.png", "study.png", "throughput.png", "training.png"]

    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert "report-demo" in text and "enc-s0" in text and "dec-t0" in text
    assert re.search(r'<span class="state finished">finished</span>', dom)
    # What the real channel counted shows on the page: the dead letter with its reason.
    from nebula_mq.report.parse import load_run

    dead = load_run(run_dir).workers["dec-t0"].metrics.dead_letters  # type: ignore[union-attr]
    [(flow, reason)] = [k for k, v in dead.items() if v == 1]
    assert f"{reason}: 1" in text and flow == "activations"
    assert "1 message(s) dead-lettered" in text
    assert "wan_cut" in text and "fp16(svd(0.6))" in text and "activations" in text
    assert "bench/codecs.json" in text and "encode_MBps" in text and "cores=2" in text
    assert "problem(s) reading" not in text

    shot = tmp_path / "shot.png"
    chromium(f"--user-data-dir={tmp_path / 'profile-shot'}", "--window-size=1280,3000",
             "--virtual-time-budget=10000", f"--screenshot={shot}", page.as_uri())
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    assert rgb.shape[:2] == (3000, 1280)
    non_white = (np.abs(rgb - 255).sum(axis=2) > 30).mean()
    colours = len(np.unique(rgb.reshape(-1, 3)[::7], axis=0))
    # A rendered page with a dark header, tables and plots: far from blank or one flat colour.
    assert non_white > 0.08 and colours > 200, (non_white, colours)


def test_run_dir_written_by_the_runtime_is_read_back_exactly(run_dir: Path) -> None:
    """No browser needed: the parser agrees with what the real runtime classes wrote."""
    from nebula_mq.report.parse import load_run

    run = load_run(run_dir)
    assert run.problems == ()
    assert set(run.workers) == {"enc-s0", "dec-t0"}
    enc, dec = run.workers["enc-s0"], run.workers["dec-t0"]
    assert [int(r["step"]) for r in dec.history] == list(range(1, STEPS + 1))
    assert [int(r["step"]) for r in enc.history] == list(range(1, STEPS + 1))
    assert enc.status is not None and enc.status.state == "finished" and enc.status.step == STEPS
    assert dec.checkpoints[-1] == STEPS
    # The encoder was restarted at RESTART_AT: its counters cover the second process only.
    assert enc.metrics is not None and enc.metrics.steps == STEPS - RESTART_AT
    assert dec.metrics is not None and dec.metrics.steps == STEPS
    assert dec.metrics.messages[("activations", "in")] == STEPS + 1  # the repeat came in too, then was dropped
    assert dec.metrics.duplicates == {"activations": 1.0}
    assert sum(dec.metrics.dead_letters.values()) == 1
    # fp16 halves the activations on the wire (plus a small envelope header).
    raw, wire = dec.metrics.raw_bytes[("activations", "in")], dec.metrics.wire_bytes[("activations", "in")]
    assert raw == (STEPS + 1) * 16 * 24 * 64 * 4 and 1.9 < raw / wire < 2.0
    assert run.faults[0].kind == "wan_cut" and len(run.study) == 3


@needs_chromium
def test_the_evaluation_shows_scores_per_domain_and_examples_beside_the_loss_curves(
        run_dir: Path, tmp_path: Path) -> None:
    from nebula_mq.evaluation.bleu import evaluation_body

    refs = ["Open the file", "Cannot read the disk", "Save changes", "In the beginning God created the heavens"]
    hyps = ["open the file", "cannot read disk", "save the changes", "in the beginning god made the heaven"]
    domains = ["gettext", "gettext", "gettext", "bible"]
    body = evaluation_body("test", [11, 12, 13, 40], hyps, refs, domains, beam=4)
    (run_dir / "eval.json").write_text(json.dumps(body))
    out = tmp_path / "report"
    cli = subprocess.run([sys.executable, "-m", "nebula_mq", "report", str(run_dir), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    dom = chromium(f"--user-data-dir={tmp_path / 'profile-eval'}", "--virtual-time-budget=10000",
                   "--dump-dom", (out / "report.html").as_uri()).stdout
    section = re.search(r'<section id="evaluation">(.*?)</section>', dom, re.S)
    assert section is not None
    html = section.group(1)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    for domain in ("all", "gettext", "bible"):
        row = body["by_domain"][domain]
        assert f"{domain} {int(row['sentences'])} {row['bleu']:.2f} {row['chrf']:.2f}" in text
    assert "cannot read disk" in text and "In the beginning God created the heavens" in text
    # The loss curves sit beside the scores, and the figure decoded in the browser.
    assert re.search(r'<img src="data:image/png;base64,[^"]+" alt="training values per step"[^>]*data-natural=', html)
    figures = re.search(r'<html[^>]*data-figures="(\d+)/(\d+)"', dom)
    assert figures is not None and figures.group(1) == figures.group(2) == "7"  # with the queues plot


def rows_of(dom: str, worker: str) -> int:
    """The throughput table's history-row count of ``worker``, as the browser shows it."""
    found = re.search(rf'<td class=""><code>{worker}</code></td><td class="num">([\d,]+)</td>', dom)
    assert found is not None, dom[:2000]
    return int(found.group(1).replace(",", ""))


@needs_chromium
def test_report_serve_shows_the_run_growing_in_a_browser(run_dir: Path, tmp_path: Path) -> None:
    """``report --serve``: on loopback, rebuilt every --every seconds, and the page reloads itself."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "nebula_mq", "report", str(run_dir), "--out", str(tmp_path / "live"),
                             "--serve", "--port", str(port), "--every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert "serving http://127.0.0.1:" in proc.stdout.readline()
        url = f"http://127.0.0.1:{port}/report.html"
        first = chromium(f"--user-data-dir={tmp_path / 'p1'}", "--dump-dom", url).stdout
        assert 'http-equiv="refresh" content="1"' in first
        before = rows_of(first, "dec-t0")
        history = run_dir / "history" / "dec-t0.jsonl"
        last = json.loads(history.read_text().splitlines()[-1])
        with history.open("a") as fh:  # the job goes on: ten more steps
            for k in range(1, 11):
                fh.write(json.dumps({**last, "step": last["step"] + k, "time": last["time"] + k}) + "\n")
        deadline = time.monotonic() + 30
        while True:
            after = rows_of(chromium(f"--user-data-dir={tmp_path / 'p2'}", "--dump-dom", url).stdout, "dec-t0")
            if after == before + 10 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert after == before + 10
    finally:
        proc.terminate()
        proc.wait(10)
