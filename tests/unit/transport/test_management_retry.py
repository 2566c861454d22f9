"""The management API client against a real HTTPS server with mutual TLS that answers 500
for a while, as a busy broker does: an idempotent call asks again within its attempts, a
write never does, and the last answer's error is the one raised."""

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
from nebula_mq.transport import management
from nebula_mq.transport.management import ManagementClient

A = "cluster-a"


class _Busy(http.server.BaseHTTPRequestHandler):
    """Answers 500 to the first ``failures`` requests, then 200 with a JSON body."""

    failures = 0
    seen: list[str] = []

    def _answer(self) -> None:
        type(self).seen.append(self.command)
        if len(self.seen) <= self.failures:
            self.send_response(500, "Internal Server Error")
            self.end_headers()
            return
        body = json.dumps({"name": "v"}).encode()
        self.send_response(200)
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
    handler = type("Handler", (_Busy,), {"seen": []})
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
    handler.failures = 2
    assert ManagementClient(broker).request(method, "vhosts/v", attempts=3) == {"name": "v"}
    assert handler.seen == [method] * 3


def test_the_last_attempts_500_is_raised_naming_the_call(busy_broker: tuple[BrokerSettings, type[_Busy]]) -> None:
    broker, handler = busy_broker
    handler.failures = 5
    with pytest.raises(TransportError, match=r"management API GET vhosts/v: HTTP 500 Internal Server Error"):
        ManagementClient(broker).request("GET", "vhosts/v", attempts=3)
    assert len(handler.seen) == 3


def test_a_write_is_never_sent_twice(busy_broker: tuple[BrokerSettings, type[_Busy]]) -> None:
    broker, handler = busy_broker
    handler.failures = 1
    with pytest.raises(TransportError, match="HTTP 500"):
        ManagementClient(broker).request("PUT", "vhosts/v", {"tags": ""}, attempts=3)
    assert handler.seen == ["PUT"]
