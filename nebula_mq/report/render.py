"""The run report as one self-contained HTML page.

Figures are inlined as ``data:image/png`` URIs: the page is a single file that
can be attached to an issue, archived as a CI artifact or mailed, and opened
offline without broken links. The same PNGs are also written to ``figures/``
beside it for reuse in slides and papers; the page does not depend on them.

No external resources (fonts, scripts, styles). The one inline script only
marks figures that failed to decode, so a broken image is visible as text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from nebula_mq.report import derive, plots
from nebula_mq.report.evaluation import evaluation_section
from nebula_mq.report.feed import FeedView, feed_section, load_run_or_none
from nebula_mq.report.html_parts import e, json_tables
from nebula_mq.report.html_parts import figure as _figure
from nebula_mq.report.html_parts import num as _num
from nebula_mq.report.html_parts import section as _section
from nebula_mq.report.html_parts import table as _table
from nebula_mq.report.parse import load_run
from nebula_mq.report.records import RunData
from nebula_mq.report.style import CSS, SCRIPT

STUDY_COLUMNS = ("chain", "bleu", "forward_ratio", "backward_ratio", "s_per_step")


def build_report(run_dir: str | Path, out_dir: str | Path | None = None, refresh_s: float | None = None,
                 feed: FeedView | None = None) -> Path:
    """Read ``run_dir``, write ``report.html`` (and ``figures/*.png``) to ``out_dir``; with
    ``refresh_s`` the page reloads itself that often (``report --serve``); with ``feed``, it
    shows every worker of the job from the status feed (then an absent ``run_dir`` is no error)."""
    run = load_run(run_dir) if feed is None else load_run_or_none(run_dir)
    out = Path(out_dir) if out_dir is not None else run.run_dir / "report"
    origin = derive.time_origin(run) or 0.0
    figures = {
        "training": plots.training_curves(run),
        "throughput": plots.throughput(run, origin),
        "link": plots.link_utilisation(run, origin),
        "queues": plots.queue_depths(run, origin),
        "compute_wait": plots.compute_wait(run),
        "study": plots.study_tradeoff(run.study),
    }
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for name, png in figures.items():
        if png is not None:
            (out / "figures" / f"{name}.png").write_bytes(png)
    page = out / "report.html"
    tmp = out / ".report.html.tmp"  # a browser reloading mid-write never sees half a page
    tmp.write_text(render_html(run, figures, time.time(), refresh_s, feed), encoding="utf-8")
    tmp.replace(page)
    return page


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


# --------------------------------------------------------------------------- sections


STALE_AFTER_S = 300.0  # a "running" worker silent this long before the report is likely dead


def _state_badge(state: str, updated: float, generated: float) -> str:
    badge = f'<span class="state {e(state)}">{e(state)}</span>'
    if state in ("running", "starting", "resuming") and updated > 0 and generated - updated > STALE_AFTER_S:
        badge += (f' <span class="stale" title="no status update for a while: crashed or hung?">'
                  f"silent {e(derive.human_duration(generated - updated))}</span>")
    return badge


def _summary(run: RunData, generated: float) -> str:
    workers = list(run.workers.values())
    traffic = derive.flow_compression(workers)
    wire_total = sum(f.wire_bytes for f in traffic)
    times = [r["time"] for w in workers for r in (w.history[:1] + w.history[-1:])]
    span = max(times) - min(times) if len(times) >= 2 else None
    steps = [w.status.step for w in workers if w.status] + [int(w.history[-1]["step"]) for w in workers if w.history]
    dead = sum(sum(w.metrics.dead_letters.values()) for w in workers if w.metrics)
    dups = sum(sum(w.metrics.duplicates.values()) for w in workers if w.metrics)
    cards = [
        ("workers", f"{len(workers)}", ", ".join(sorted({w.status.role for w in workers if w.status})) or "roles unknown"),
        ("last step", _num(max(steps)) if steps else "–", "highest step any worker reached"),
        ("wall time", derive.human_duration(span) if span else "–", "first to last history row"),
        ("on the wire", derive.human_bytes(wire_total) if traffic else "–", "all flows, counted once (sender side)"),
        ("avg link rate", derive.human_bits_rate(8 * wire_total / span) if traffic and span else "–",
         "wire bytes / wall time"),
        ("dead letters", _num(dead), "messages condemned"),
        ("duplicates", _num(dups), "deliveries dropped as repeats"),
        ("faults", _num(len(run.faults)), f"{sum(f.recovered_after_s is not None for f in run.faults)} recovered"),
    ]
    alert = {"dead letters": dead > 0, "faults": any(f.recovered_after_s is None for f in run.faults)}
    card_html = "".join(
        f'<div class="card{" alert" if alert.get(k) else ""}"><div class="k">{e(k)}</div>'
        f'<div class="v">{e(v)}</div><div class="d">{e(d)}</div></div>' for k, v, d in cards)
    rows, classes = [], []
    for w in workers:
        s = w.status
        values = s.values if s else (w.metrics.values if w.metrics else {})
        rows.append([
            f"<code>{e(w.worker_id)}</code>", e(s.role) if s else "–", e(s.cluster) if s else "–",
            _state_badge(s.state, s.updated, generated) if s else '<span class="state">no status</span>',
            _num(s.step) if s else (_num(w.history[-1]["step"]) if w.history else "–"),
            e(", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()))) or "–",
            _num(w.checkpoints[-1]) if w.checkpoints else "–",
            e(_utc(s.updated)) if s else "–", str(s.pid) if s else "–",
        ])
        classes.append("bad" if s and s.state == "failed" else "")
    table = _table(["worker", "role", "cluster", "state", "step", "last values", "checkpoint", "updated", "pid"],
                   rows, numeric=(4, 6, 8), row_class=classes)
    return f'<div class="cards">{card_html}</div>{table}'


def _throughput(run: RunData, figures: Mapping[str, bytes | None]) -> str:
    rows = []
    for w in run.workers.values():
        if len(w.history) >= 2:
            dt = w.history[-1]["time"] - w.history[0]["time"]
            rate = (len(w.history) - 1) / dt if dt > 0 else None
            rows.append([f"<code>{e(w.worker_id)}</code>", _num(len(w.history)), derive.human_duration(dt),
                         f"{rate:.3g}" if rate else "–", _num(w.metrics.steps) if w.metrics else "–"])
    fig = _figure(figures.get("throughput"), "steps per second over time, per worker",
                  "Steps per second from history timestamps (binned). Dashed red lines: injected faults; "
                  "shaded: until the target recovered.", "No history with timestamps: no throughput curve.")
    table = _table(["worker", "history rows", "span", "mean steps/s", "steps (current process)"], rows)
    return fig + table


def _link(run: RunData, figures: Mapping[str, bytes | None]) -> str:
    fig = _figure(figures.get("link"), "estimated wire bit rate over time, per sending worker",
                  "Estimated: steps/s(t) &times; the worker's mean wire bytes per step (counters are totals "
                  "without timestamps). Exact totals and process averages below.",
                  "No history timestamps with wire byte totals: showing totals and averages only.")
    rows = []
    for r in derive.traffic_rows(run.workers.values()):
        ratio = r.raw_bytes / r.wire_bytes if r.wire_bytes else None
        rows.append([f"<code>{e(r.worker)}</code>", e(r.flow), e(r.direction), _num(r.messages),
                     derive.human_bytes(r.raw_bytes), derive.human_bytes(r.wire_bytes),
                     f"{ratio:.2f}&times;" if ratio else "–",
                     derive.human_bits_rate(r.avg_bits_per_s) if r.avg_bits_per_s is not None else "–"])
    table = _table(["worker", "flow", "dir", "messages", "raw", "wire", "raw/wire", "avg wire rate"],
                   rows, numeric=range(3, 8))
    return fig + "<h3>Traffic totals</h3>" + table


def _compression(run: RunData, figures: Mapping[str, bytes | None]) -> str:
    parts = []
    if run.study:
        extra = sorted({k for r in run.study for k in r} - set(STUDY_COLUMNS))
        cols = [*STUDY_COLUMNS, *extra]
        best = max((float(r["bleu"]) for r in run.study if isinstance(r.get("bleu"), (int, float))), default=None)
        rows = [[f"<code>{e(str(r.get('chain')))}</code>", *(_num(r[c]) if c in r else "–" for c in cols[1:])]
                for r in run.study]
        classes = ["best" if best is not None and r.get("bleu") == best else "" for r in run.study]
        parts.append("<h3>Compression study</h3>" + _table(cols, rows, row_class=classes))
        parts.append(_figure(figures.get("study"), "BLEU against forward compression ratio",
                             "Quality against compression, one point per codec chain (best BLEU row in bold above).",
                             "Fewer than two study rows with BLEU and forward ratio: no trade-off plot."))
    flows = derive.flow_compression(run.workers.values())
    rows = [[f"<code>{e(f.flow)}</code>", e(f.direction), _num(f.messages), derive.human_bytes(f.raw_bytes),
             derive.human_bytes(f.wire_bytes), f"{f.ratio:.2f}&times;" if f.ratio else "–"] for f in flows]
    title = "Measured in this run (per flow)" if run.study else "No study/ rows: measured per flow in this run"
    parts.append(f"<h3>{title}</h3>" + _table(["flow", "counted at", "messages", "raw", "wire", "raw/wire"],
                                                rows, numeric=range(2, 6)))
    return "".join(parts)


def _compute_wait(run: RunData, figures: Mapping[str, bytes | None]) -> str:
    rows = []
    for w in run.workers.values():
        if w.metrics is None:
            continue
        c, wt, wall = w.metrics.compute_s, w.metrics.wait_s, derive.process_wall_s(w)
        share = wt / (c + wt) if c + wt > 0 else None
        rows.append([f"<code>{e(w.worker_id)}</code>", f"{c:.1f}", f"{wt:.1f}",
                     f"{max(0.0, wall - c - wt):.1f}" if wall else "–",
                     f"{100 * share:.0f}%" if share is not None else "–"])
    fig = _figure(figures.get("compute_wait"), "compute, wait and other time per worker",
                  "Seconds of the worker's current process. A high wait share on one side of a pipeline "
                  "means the other side or the link is the bottleneck.", "No compute/wait counters.")
    return fig + _table(["worker", "compute s", "wait s", "other s", "wait share"], rows)


def _integrity(run: RunData) -> str:
    rows, classes = [], []
    for w in run.workers.values():
        m = w.metrics
        if m is None:
            continue
        flows = sorted({f for f, _ in m.messages} | set(m.duplicates) | set(m.redeliveries)
                       | {f for f, _ in m.dead_letters})
        for flow in flows:
            dead = {r: v for (f, r), v in m.dead_letters.items() if f == flow and v}
            received = m.messages.get((flow, "in"), 0)
            if not (received or dead or m.duplicates.get(flow) or m.redeliveries.get(flow)):
                continue  # the sending side of a flow: nothing to say here
            rows.append([f"<code>{e(w.worker_id)}</code>", e(flow),
                         _num(received), _num(m.redeliveries.get(flow, 0)),
                         _num(m.duplicates.get(flow, 0)), _num(sum(dead.values())),
                         e(", ".join(f"{r}: {v:.0f}" for r, v in sorted(dead.items()))) or "–"])
            classes.append("bad" if dead else ("warn" if m.duplicates.get(flow) else ""))
    total_dead = sum(sum(w.metrics.dead_letters.values()) for w in run.workers.values() if w.metrics)
    note = ('<p class="ok">No dead letters.</p>' if not total_dead else
            f'<p class="badnote">{_num(total_dead)} message(s) dead-lettered: see the reasons below '
            "and the job's dead-letter queue.</p>")
    return note + _table(["worker", "flow", "received", "redelivered", "duplicates", "dead letters", "reasons"],
                         rows, numeric=range(2, 6), row_class=classes)


def _faults(run: RunData, origin: float) -> str:
    if not run.faults:
        return '<p class="empty">No faults.jsonl: no faults were injected in this run.</p>'
    rows = [[e(_utc(f.time)), f"{f.time - origin:+.1f}", e(f.kind), f"<code>{e(f.target)}</code>",
             f"{f.recovered_after_s:.1f}" if f.recovered_after_s is not None else "not recovered"]
            for f in run.faults]
    classes = ["bad" if f.recovered_after_s is None else "" for f in run.faults]
    rec = [f.recovered_after_s for f in run.faults if f.recovered_after_s is not None]
    note = (f"<p>{len(run.faults)} fault(s); {len(rec)} recovered"
            + (f", mean {sum(rec) / len(rec):.1f} s, worst {max(rec):.1f} s" if rec else "") + ".</p>")
    return note + _table(["time", "t (s)", "kind", "target", "recovered after (s)"], rows,
                         numeric=(1, 4), row_class=classes)


def _bench(run: RunData) -> str:
    if not run.bench:
        return '<p class="empty">No bench/*.json in this run.</p>'
    return "".join(f"<h3><code>bench/{e(stem)}.json</code></h3>" + json_tables(doc)
                   for stem, doc in sorted(run.bench.items()))


# --------------------------------------------------------------------------- page


def render_html(run: RunData, figures: Mapping[str, bytes | None], generated: float,
                refresh_s: float | None = None, feed: FeedView | None = None) -> str:
    origin = derive.time_origin(run) or 0.0
    jobs = sorted({w.status.job for w in run.workers.values() if w.status})
    job = ", ".join(jobs) if jobs else run.run_dir.name
    state = derive.job_state(run.workers.values())
    sections = [("feed", "Every worker (status feed)", feed_section(feed))] if feed is not None else []
    sections += [
        ("summary", "Job summary", _summary(run, generated)),
        ("training", "Training curves", _figure(
            figures.get("training"), "training values per step, per worker",
            "Per-step values from history/*.jsonl; with many steps the faint trace is raw, the solid line an "
            "exponential moving average.", "No history/*.jsonl rows: no training curves.")),
        ("evaluation", "Evaluation", evaluation_section(run.evaluation, figures.get("training"))),
        ("throughput", "Throughput", _throughput(run, figures)),
        ("link", "Link utilisation", _link(run, figures)),
        ("queues", "Queues and backpressure", _figure(
            figures.get("queues"), "ready messages per queue over time",
            "Each worker samples the queues it reads (and its dead-letter queue) every 10 s "
            "(queues/*.jsonl). A queue that grows while its consumer is busy is backpressure at work; "
            "the sending side's queue is capped, so the producer waits instead of the broker filling up.",
            "No queues/*.jsonl samples: workers older than this report, or a run shorter than a sample.")),
        ("compression", "Compression", _compression(run, figures)),
        ("time", "Compute vs wait", _compute_wait(run, figures)),
        ("integrity", "Dead letters and duplicates", _integrity(run)),
        ("faults", "Faults and recoveries", _faults(run, origin)),
        ("bench", "Benchmarks", _bench(run)),
    ]
    nav = "".join(f'<a href="#{a}">{e(t)}</a>' for a, t, _ in sections)
    problems = ""
    if run.problems:
        items = "".join(f"<li><code>{e(p)}</code></li>" for p in run.problems)
        problems = (f'<div class="problems"><b>{len(run.problems)} problem(s) reading the run directory</b>'
                    f" (shown data excludes these):<ul>{items}</ul></div>")
    body = "".join(_section(a, t, b) for a, t, b in sections)
    refresh = f'\n<meta http-equiv="refresh" content="{max(1, round(refresh_s))}">' if refresh_s else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">{refresh}
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nebula-mq report: {e(job)}</title>
<style>{CSS}</style></head>
<body>
<header><div class="title"><span class="brand">nebula-mq</span> run report
<span class="job">{e(job)}</span> <span class="state {e(state)}">{e(state)}</span></div>
<div class="meta">run dir <code>{e(str(run.run_dir))}</code> &middot; generated {e(_utc(generated))}</div>
<nav>{nav}</nav></header>
<main>{problems}{body}
<footer>Counters (bytes, messages, compute/wait) come from metrics/*.prom and cover each worker's
<em>current process</em> since its last start; history/*.jsonl and checkpoints span restarts.
Times are UTC.</footer></main>
<script>{SCRIPT}</script>
</body></html>
"""
