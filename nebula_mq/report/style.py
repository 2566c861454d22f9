"""The page's CSS and its one small script, kept apart from the HTML builders."""

CSS = """
:root { --fg:#1a202c; --muted:#718096; --line:#e2e8f0; --bg:#f7fafc; --accent:#2b6cb0;
        --bad:#c53030; --badbg:#fff5f5; --warnbg:#fffaf0; --ok:#276749; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--fg); background:var(--bg); }
header { background:#1a202c; color:#edf2f7; padding:14px 28px 0; }
header .title { font-size:20px; font-weight:600; }
header .brand { color:#90cdf4; }
header .job { font-family:ui-monospace,"DejaVu Sans Mono",monospace; margin-left:6px; }
header .meta { color:#a0aec0; font-size:12px; margin-top:4px; }
header code { color:#e2e8f0; }
nav { margin-top:10px; display:flex; flex-wrap:wrap; gap:2px; }
nav a { color:#cbd5e0; text-decoration:none; padding:6px 10px; font-size:13px; border-radius:4px 4px 0 0; }
nav a:hover { background:#2d3748; color:white; }
main { max-width:1180px; margin:0 auto; padding:8px 28px 40px; }
section { background:white; border:1px solid var(--line); border-radius:6px; padding:6px 20px 16px;
          margin:18px 0; }
h2 { font-size:17px; margin:12px 0 10px; }
h3 { font-size:14px; margin:18px 0 6px; color:#2d3748; }
h4 { font-size:13px; margin:12px 0 4px; color:var(--muted); }
code { font-family:ui-monospace,"DejaVu Sans Mono",monospace; font-size:12.5px; }
table { border-collapse:collapse; width:100%; font-size:13px; margin:6px 0; }
th { text-align:left; font-weight:600; color:#4a5568; border-bottom:2px solid var(--line); padding:5px 8px; }
td { border-bottom:1px solid var(--line); padding:4px 8px; }
th.num, td.num { text-align:right; font-variant-numeric:tabular-nums; }
tr.bad td { background:var(--badbg); }
tr.warn td { background:var(--warnbg); }
tr.best td { font-weight:600; }
figure { margin:6px 0 10px; }
figure img { max-width:100%; height:auto; display:block; }
.side-by-side { display:grid; grid-template-columns:minmax(0,1fr) minmax(0,1fr); gap:16px; align-items:start; }
@media (max-width: 900px) { .side-by-side { grid-template-columns:1fr; } }
figcaption { color:var(--muted); font-size:12px; margin-top:2px; }
.cards { display:grid; grid-template-columns:repeat(auto-fill,minmax(118px,1fr)); gap:10px; margin:6px 0 14px; }
.card { border:1px solid var(--line); border-radius:6px; padding:8px 10px; background:#fbfdff; }
.card .k { color:var(--muted); font-size:11px; text-transform:uppercase; letter-spacing:.04em; }
.card .v { font-size:18px; white-space:nowrap; font-weight:600; font-variant-numeric:tabular-nums; }
.card .d { color:var(--muted); font-size:11px; }
.card.alert { border-color:#feb2b2; background:var(--badbg); }
.card.alert .v { color:var(--bad); }
.state { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600;
         background:#edf2f7; color:#4a5568; }
.state.finished { background:#c6f6d5; color:#22543d; }
.state.running, .state.starting, .state.resuming { background:#bee3f8; color:#2a4365; }
.state.stopped { background:#fefcbf; color:#744210; }
.state.failed, .state.LOST { background:#fed7d7; color:#822727; }
.stale { color:var(--bad); font-size:12px; font-weight:600; }
.empty { color:var(--muted); font-style:italic; }
.ok { color:var(--ok); font-weight:600; }
.badnote { color:var(--bad); font-weight:600; }
.broken { color:var(--bad); border:1px dashed var(--bad); padding:20px; }
.problems { background:var(--warnbg); border:1px solid #fbd38d; border-radius:6px; padding:10px 16px;
            margin:18px 0; }
.kv { margin:2px 0; font-size:13px; }
footer { color:var(--muted); font-size:12px; margin-top:20px; }
"""

# Records each figure's decoded size on the <img> (data-natural="WxH") and the
# count on <html data-figures="ok/total">; a figure that failed to decode is
# replaced by a visible note instead of an empty box.
SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images), ok = 0;
  imgs.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) {
      img.setAttribute("data-natural", img.naturalWidth + "x" + img.naturalHeight); ok++;
    } else {
      var p = document.createElement("p"); p.className = "broken";
      p.textContent = "figure failed to load: " + img.alt; img.replaceWith(p);
    }
  });
  document.documentElement.setAttribute("data-figures", ok + "/" + imgs.length);
});
"""
