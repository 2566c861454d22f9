"""The management API client against a real HTTPS server with mutual TLS that answers 500
for a while, as a busy broker does: an idempotent call asks again within its attempts, a
write never does, the last answer's error is the one raised, and deprovisioning gets through."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq.errors import TransportError
from nebula_mq.security.certs import init_certs
from nebula_mq.settings import BrokerSettings
from nebula_mq.stack.admin import HttpAdmin
from nebula_mq.transport import management
from nebula_mq.transport.management import ManagementClient

A = "cluster-a"


class _Busy(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next status of ``answers`` (200 with a JSON body once
    they run out), and records what it was asked."""

    answers: list[int] = []
    seen: list[tuple[str, str]] = []
    timeout = 5  # a client that stalls mid-request cannot hold the server past the test

    def _answer(self) -> None:
        type(self).seen.append((self.command, self.path))
        status = self.answers.pop(0) if self.answers else 200
        body = json.dumps({"name": "v"}).encode() if status == 200 else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = do_PUT = _answer

    def log_message(self, *args: object) -> None:  # the test reads what it asserts, not a log
        pass


@pytest.fixture
def busy_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BrokerSettings, type[_Busy]]]:
    monkeypatch.setattr(management, "RETRY_PAUSE_S", 0.01)
    ca = init_certs(tmp_path, [A])[A]
    server, client = ca.server(), ca.ensure_client("ops")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert_file, server.key_file)
    context.load_verify_locations(server.ca_file)
    context.verify_mode = ssl.CERT_REQUIRED
    handler = type("Handler", (_Busy,), {"seen": [], "answers": []})
    httpd = http.server.HTTPServer(("127.0.0.1", 0), handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    password = tmp_path / "admin.pw"
    password.write_text("secret")
    broker = BrokerSettings(host="127.0.0.1", server_name="localhost", ca_file=str(client.ca_file),
                            cert_file=str(client.cert_file), key_file=str(client.key_file),
                            management_port=httpd.server_address[1], management_user="ops",
                            management_password_file=str(password))
    yield broker, handler
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_idempotent_call_asks_a_busy_broker_again_within_its_attempts(
        busy_broker: tuple[BrokerSettings, type[_Busy]], method: str) -> None:
    broker, handler = busy_broker
    handler.answers = [500, 503]
    assert ManagementClient(broker).request(method, "vhosts/v", attempts=3) == {"name": "v"}
    assert [m for m, _ in handler.seen] == [method] * 3


def test_the_last_attempts_500_is_raised_naming_the_call(busy_broker: tuple[BrokerSettings, type[_Busy]]) -> None:
    broker, handler = busy_broker
    handler.answers = [500] * 5
    with pytest.raises(TransportError, match=r"management API GET vhosts/v: HTTP 500 .*\(after 3 attempts\)"):
        ManagementClient(broker).request("GET", "vhosts/v", attempts=3)
    assert len(handler.seen) == 3


def test_a_write_is_never_sent_twice(busy_broker: tuple[BrokerSettings, type[_Busy]]) -> None:
    broker, handler = busy_broker
    handler.answers = [500]
    with pytest.raises(TransportError, match="HTTP 500"):
        ManagementClient(broker).request("PUT", "vhosts/v", {"tags": ""}, attempts=3)
    assert [m for m, _ in handler.seen] == ["PUT"]


def test_deprovisioning_rides_out_a_busy_broker_and_a_delete_that_landed_before_its_500(
        busy_broker: tuple[BrokerSettings, type[_Busy]]) -> None:
    """The CI failure this guards: ``GET vhosts/X`` answered 500 on a loaded host. Here the
    existence check meets 500 once; the DELETE's first answer is 500 though it deleted, so its
    second finds 404, which is success."""
    broker, handler = busy_broker
    handler.answers = [500, 200, 500, 404]
    assert HttpAdmin(broker).delete_vhost("nebula-j1")
    assert handler.seen == [("GET", "/api/vhosts/nebula-j1?disable_stats=true")] * 2 + [
        ("DELETE", "/api/vhosts/nebula-j1")] * 2
