"""One RabbitMQ node of the local stack: render its config, start, probe, stop, run rabbitmqctl.

Nodes run from the system's ``/usr/lib/rabbitmq/bin`` scripts as root (the
``/usr/sbin`` wrappers switch user). Every ``rabbitmqctl`` call passes ``-n`` with
this node's name: the system node on 5672 is never addressed.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from string import Template
from typing import NoReturn

from nebula_mq.errors import StackError
from nebula_mq.security.certs import ClusterCA, Identity
from nebula_mq.security.pem import write_private
from nebula_mq.security.revocation import ensure_crls
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES
from nebula_mq.stack.layout import NodeLayout, port_free, run_command, running_pid, wait_until

RABBITMQ_BIN = Path(os.environ.get("NEBULA_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
BROKER_DIR = Path(__file__).resolve().parents[2] / "broker"
# The default user (made at the database's first boot): the stack's administrator through the
# management API (stack.admin.local_admin). AMQP takes certificates only. An older name, kept.
STACK_ADMIN = "nebula-admin-disabled"


def _template(name: str) -> str:
    try:
        return (BROKER_DIR / name).read_text()
    except OSError as exc:
        raise StackError(f"broker template {name} missing in {BROKER_DIR}: {exc}") from None


def node_env(node: NodeLayout) -> dict[str, str]:
    """Environment of this node's server and of every CLI call addressed to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(
        HOME=str(node.home),
        RABBITMQ_NODENAME=node.node,
        RABBITMQ_NODE_PORT=str(node.tls_port),
        RABBITMQ_DIST_PORT=str(node.dist_port),
        RABBITMQ_CONFIG_FILE=str(node.config_file),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(node.advanced_config_file),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(node.plugins_file),
        RABBITMQ_MNESIA_BASE=str(node.mnesia_base),
        RABBITMQ_LOG_BASE=str(node.log_base),
        RABBITMQ_CONF_ENV_FILE=str(node.env_file),
        RABBITMQ_PID_FILE=str(node.pid_file),
        # A VM that fails to boot dumps here, not into the caller's working directory.
        ERL_CRASH_DUMP=str(node.log_base / "erl_crash.dump"),
    )
    return env


def render(node: NodeLayout, server: Identity, listen: str = "127.0.0.1", management_listen: str = "127.0.0.1") -> None:
    """Write the node's config files from ``broker/`` templates (idempotent). The AMQPS
    listener is on loopback, and also on ``listen`` when that is another address; the
    management API's is on ``management_listen`` only."""
    for d in (node.home, node.mnesia_base, node.log_base):
        d.mkdir(parents=True, exist_ok=True)
    cookie = node.home / ".erlang.cookie"
    if not cookie.exists():
        fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(20).upper())
    # The default user's password stays what the node's database was first booted with.
    old = node.config_file.read_text() if node.config_file.exists() else ""
    kept = [ln.split("=", 1)[1].strip() for ln in old.splitlines() if ln.startswith("default_pass")]
    password = kept[0] if kept else secrets.token_hex(16)
    conf = Template(_template("rabbitmq.conf.template")).substitute(
        node=node.node,
        tls_port=node.tls_port,
        listeners=_listeners(listen, node.tls_port),
        ca_file=server.ca_file,
        cert_file=server.cert_file,
        key_file=server.key_file,
        default_user=STACK_ADMIN,
        default_pass=password,
        max_message_size=BROKER_MAX_MESSAGE_BYTES,
    )
    write_private(node.config_file, conf.encode())
    write_private(admin_password_file(node), f"{password}\n".encode())
    node.plugins_file.write_text(_template("enabled_plugins"))
    node.env_file.write_text(_template("rabbitmq-env.conf.template"))
    node.advanced_config_file.write_text(
        Template(_template("advanced.config.template")).substitute(
            node=node.node, mgmt_port=node.mgmt_port, mgmt_ip=_erl_string(management_listen), ca_file=_erl_string(server.ca_file), cert_file=_erl_string(server.cert_file),
            key_file=_erl_string(server.key_file), crl_dir=_erl_string(_crl_dir(server))))


def _listeners(listen: str, port: int) -> str:
    if listen in ("0.0.0.0", "::"):  # every address, loopback included
        return f"listeners.ssl.1 = {port}"
    lines = [f"listeners.ssl.1 = 127.0.0.1:{port}"]
    if listen != "127.0.0.1":
        host = f"[{listen}]" if ":" in listen else listen
        lines.append(f"listeners.ssl.2 = {host}:{port}")
    return "\n".join(lines)


def _erl_string(path: object) -> str:
    s = str(path)
    if '"' in s or "\\" in s:
        raise StackError(f"path {s!r} must not contain quotes or backslashes (it goes into an Erlang string)")
    return s


def _crl_dir(server: Identity) -> str:
    """Fresh CRLs of every CA next to ``server``'s (DIR/<cluster>/trust.pem -> DIR/crl).

    ``crl_check`` refuses a peer whose issuer has no CRL, so every CA gets one
    (empty until something is revoked) before the node starts.
    """
    certs_dir = Path(server.ca_file).parent.parent
    cas = [ClusterCA(certs_dir, d.name) for d in sorted(certs_dir.iterdir()) if (d / "ca.pem").is_file()]
    return str(ensure_crls(certs_dir, cas))


def admin_password_file(node: NodeLayout) -> Path:
    return node.path / "admin.password"


def log_file(node: NodeLayout) -> Path:
    """The node's main log (connection refusals are audited from it: ``security.broker_log``)."""
    return node.log_base / f"{node.node}.log"


def vm_pid(node: NodeLayout) -> int | None:
    """The pid of this node's Erlang VM while it is alive (its cmdline names the node's own HOME)."""
    return running_pid(node.pid_file, b"beam", str(node.home).encode() + b"\0")


def is_running(node: NodeLayout) -> bool:
    return vm_pid(node) is not None


def rabbitmqctl(node: NodeLayout, *args: str, timeout: float = 60.0, check: bool = True) -> str:
    """Run ``rabbitmqctl -n NODE ARGS``; returns stdout, raises :class:`StackError` on failure."""
    cmd = [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.node, *args]
    return run_command(cmd, f"{node.node}: rabbitmqctl {' '.join(args[:2])}", timeout, check, env=node_env(node),
                       cwd=node.path).stdout


def start(node: NodeLayout, timeout: float = 60.0) -> None:
    """Start the node detached and wait until its TLS listener answers a handshake."""
    if is_running(node):
        return
    ports = ((node.tls_port, "TLS"), (node.mgmt_port, "management HTTPS"), (node.dist_port, "Erlang distribution"))
    for port, kind in ports:
        if port and not port_free(port):
            raise StackError(f"{node.node}: {kind} port {port} is already in use (another stack or service?)")
    node.pid_file.unlink(missing_ok=True)
    server = str(RABBITMQ_BIN / "rabbitmq-server")
    out = node.log_base / "start.out"
    try:
        with open(out, "ab") as fh:
            proc = subprocess.run([server, "-detached"], env=node_env(node), cwd=node.path, stdout=fh,
                                  stderr=fh, timeout=60)
    except subprocess.TimeoutExpired:
        raise StackError(f"{node.node}: rabbitmq-server -detached did not return within 60 s; see {out}") from None
    except OSError as exc:
        raise StackError(f"cannot run {server}: {exc}") from None
    if proc.returncode != 0:
        raise StackError(f"{node.node}: rabbitmq-server -detached failed; see {out}")
    # `await_startup` right after -detached can fail (node not yet registered); `wait PIDFILE` waits.
    deadline = time.monotonic() + timeout
    wait_until(node.pid_file.exists, timeout)
    rabbitmqctl(node, "wait", "--timeout", str(int(timeout)), str(node.pid_file), timeout=timeout + 15)
    wait_tls(node, deadline)


def exec_foreground(node: NodeLayout) -> NoReturn:
    """Replace this process with the node's ``rabbitmq-server`` in the foreground (a container's
    main process; the container's init forwards SIGTERM, and RabbitMQ stops cleanly on it)."""
    node.pid_file.unlink(missing_ok=True)  # left by a container that was killed
    server = str(RABBITMQ_BIN / "rabbitmq-server")
    try:
        os.chdir(node.path)
        os.execve(server, [server], node_env(node))
    except OSError as exc:
        raise StackError(f"cannot run {server}: {exc}") from None


def wait_tls(node: NodeLayout, deadline: float) -> None:
    """Probe until the TLS port accepts TCP connections (the listener is up)."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", node.tls_port), timeout=2):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise StackError(f"{node.node}: TLS port {node.tls_port} not listening ({last})")


def tls_probe(node: NodeLayout, client: Identity, timeout: float = 5.0) -> str:
    """Complete a TLS handshake with a client certificate; returns the negotiated version."""
    ctx = ssl.create_default_context(cafile=str(client.ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(client.cert_file), str(client.key_file))
    try:
        with socket.create_connection(("127.0.0.1", node.tls_port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                return str(tls.version())
    except (OSError, ssl.SSLError) as exc:
        raise StackError(f"{node.node}: TLS probe on {node.tls_port} failed: {exc}") from None


# After a graceful stop that did not end the VM: how long SIGTERM (the VM's own orderly stop),
# then SIGKILL, get to end it.
SIGNAL_WAITS_S = ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0))
#: How long a stopped node's ports may take to close after its VM is gone (start() names a port
#: still bound after that).
PORTS_RELEASED_S = 10.0


def stop(node: NodeLayout, timeout: float = 60.0) -> None:
    """Stop the node, then wait for its VM to exit and its ports to close; a no-op when it is not
    running. A graceful stop that hangs (``rabbitmqctl stop`` has been seen to on a loaded 2-core
    host) is followed by SIGTERM, then SIGKILL: durable queues and their messages survive either,
    as they survive a power cut."""
    if not is_running(node):
        return
    _stop_vm(node, timeout)
    # An exiting process loses its memory, and with it the cmdline is_running reads, before its
    # sockets close: a restart right away found the distribution port still bound (CI, once).
    ports = [p for p in (node.tls_port, node.mgmt_port, node.dist_port) if p]
    wait_until(lambda: all(port_free(p) for p in ports), PORTS_RELEASED_S)


def _stop_vm(node: NodeLayout, timeout: float) -> None:
    try:
        rabbitmqctl(node, "stop", str(node.pid_file), timeout=timeout)
    except StackError:
        pass  # the VM is signalled below
    if wait_until(lambda: not is_running(node), timeout):
        return
    for sig, wait_s in SIGNAL_WAITS_S:
        pid = vm_pid(node)
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if wait_until(lambda: not is_running(node), wait_s):
            return
    raise StackError(f"{node.node}: still running after stop, SIGTERM and SIGKILL")
