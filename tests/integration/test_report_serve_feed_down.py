"""``nebula-mq report JOB.toml --serve --feed CLUSTER`` when the feed cannot be read: the real
reader against a broker that is down. The page says so in one line, the console once, and the
server goes on serving (and rebuilding) this host's view. The feed read from real brokers is in
``test_status_feed.py``."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

JOB = """
[job]
id = "feed-down"
scenario = "split"
steps = 30
run_dir = "{run_dir}"

[clusters.far.broker]
host = "127.0.0.1"
port = {port}
tls = false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""  # not serving yet


def test_a_feed_that_cannot_be_read_is_one_line_and_the_local_view_is_still_served(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "status").mkdir(parents=True)
    (run_dir / "status" / "head-0.json").write_text(json.dumps(
        {"worker": "head-0", "role": "split-head", "cluster": "cluster-a", "state": "running", "step": 4,
         "updated": time.time()}))
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(run_dir=run_dir, port=free_port()))  # nothing listens there: broker down
    port = free_port()
    url = f"http://127.0.0.1:{port}/report.html"
    proc = subprocess.Popen([sys.executable, "-m", "nebula_mq", "report", str(config), "--serve", "--feed", "far",
                             "--port", str(port), "--every", "1", "--out", str(tmp_path / "live")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, page = time.monotonic() + 30, ""
        while "feed-error" not in page and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            page = get(url)
        errors = re.findall(r'<p class="badnote feed-error">(.*?)</p>', page)
        assert errors and errors[0].startswith("cannot read the status feed on <b>far</b>'s broker: "
                                               "ConnectionLost: connect to 127.0.0.1:"), page[-3000:]
        assert "\n" not in errors[0] and "Traceback" not in page
        assert "<code>head-0</code>" in page.split('<section id="summary">', 1)[1]  # this host's view
        generated = re.findall(r"generated ([^<]+)</div>", page)
        while time.monotonic() < deadline and re.findall(r"generated ([^<]+)</div>", page) == generated:
            time.sleep(0.3)  # a later rebuild, the feed still down
            page = get(url)
        assert re.findall(r"generated ([^<]+)</div>", page) not in ([], generated) and "feed-error" in page
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert "Traceback" not in output, output
    assert [line for line in output.splitlines() if "status feed" in line] == [
        "serving http://127.0.0.1:%d/report.html (rebuilt every 1 s; Ctrl-C stops); status feed: far's broker" % port,
        "report: cannot read far's status feed: " + errors[0].split("broker: ", 1)[1]], output
