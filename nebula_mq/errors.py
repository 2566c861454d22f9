"""The one exception hierarchy of nebula-mq.

Every error that leaves a nebula-mq API is a :class:`NebulaError`. Third-party
errors (pika, msgpack, lz4, OpenSSL, TOML) are translated at the boundary where
they occur, with ``raise XError(...) from None`` so a caller never has to know
which library sits underneath (the dramatiq ``errors.py`` pattern).

Errors that condemn a *message* (rather than a process) carry a short, stable
``reason`` slug. The consumer runtime puts that slug into the ``x-nebula-reason``
header when it dead-letters the message, and metrics count by it.

Errors that stop a *process* say whether starting it again can help
(``restart_helps``): a broker outage or a lost peer can pass, a mistake in the job
file, the data, the user's model or the placement cannot, so the supervisor of
``run`` and ``up`` does not restart a worker that stopped with one of those. What a
user reads of any error is :func:`one_line`.
"""

from __future__ import annotations


class NebulaError(Exception):
    """Base class of every nebula-mq error."""

    #: Stable machine-readable slug, used for dead-letter headers and metrics.
    reason: str = "error"
    #: Whether a process this stopped may get past it when started again (False: the job's
    #: own config, data, model or placement is wrong, and would stop it again).
    restart_helps: bool = True


def one_line(exc: BaseException) -> str:
    """What a user reads of ``exc``. Our own errors: their message, a tool's multi-line output
    it quotes joined into one line. Anything else (a framework's, a library's): its type and
    its own first line (``RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x10 and
    12x3)``); what follows it (a hint, a C++ trace) stays in the log."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, NebulaError):
        return " ".join(lines) or type(exc).__name__
    first = next((line for line in lines if any(c.isalnum() for c in line)
                  and not line.startswith(("C++ Traceback", "Error Message Summary"))), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def after_name(worker_id: str, text: str) -> str:
    """``text`` to be shown after the worker's own name (``tail-0 (cluster-b): ...``): a
    message that begins with the name (as a worker started by hand says it) says it once."""
    return text.removeprefix(f"{worker_id}: ")


# --------------------------------------------------------------------------- config


class ConfigError(NebulaError):
    """A configuration file or override is invalid.

    The message always names the file (or environment variable), the key and
    what was expected, e.g. ``job.toml: [codec].forward: expected a codec chain
    like 'fp16(svd(0.6))', got 'fp17'``.
    """

    reason = "bad_config"
    restart_helps = False

    def __init__(self, source: str, key: str, expected: str, got: object = None) -> None:
        self.source = source
        self.key = key
        self.expected = expected
        self.got = got
        detail = f"{source}: {key}: expected {expected}"
        if got is not None:
            detail += f", got {got!r}"
        super().__init__(detail)


# --------------------------------------------------------------------------- wire / decode


class WireError(NebulaError):
    """An incoming message cannot be trusted. Never retried: dead-lettered."""

    reason = "malformed"


class MalformedMessage(WireError):
    reason = "malformed"


class TruncatedMessage(WireError):
    reason = "truncated"


class OversizedMessage(WireError):
    reason = "oversized"


class VersionMismatch(WireError):
    reason = "wrong_version"


class ChecksumMismatch(WireError):
    reason = "bad_checksum"


class AuthenticationFailed(WireError):
    """The message authentication tag is missing or does not verify."""

    reason = "bad_tag"


class ReplayedMessage(WireError):
    """A message older than what was already applied, or seen before."""

    reason = "replayed"


class UnknownJob(WireError):
    reason = "unknown_job"


class OutOfWindow(WireError):
    """A message too far in the future of the receiver's current step."""

    reason = "out_of_window"


# --------------------------------------------------------------------------- codecs


class CodecError(WireError):
    """A codec cannot encode or decode a tensor."""

    reason = "codec_error"


class UnknownCodec(CodecError):
    reason = "unknown_codec"


class NonFiniteTensor(CodecError):
    """NaN or Inf in a tensor where the configuration forbids it."""

    reason = "non_finite"


class ShapeMismatch(CodecError):
    reason = "bad_shape"


class DecodedTooLarge(CodecError):
    """Decoding a message would materialise more bytes than its per-message cap allows."""

    reason = "oversized"


# --------------------------------------------------------------------------- transport


class TransportError(NebulaError):
    """The broker connection failed or refused an operation."""

    reason = "transport"


class ConnectionLost(TransportError):
    reason = "connection_lost"


class PublishRejected(TransportError):
    """The broker nacked a publish: the bounded queue is full (backpressure)."""

    reason = "rejected"


class Unroutable(TransportError):
    """A mandatory publish had no queue to go to: topology is missing."""

    reason = "unroutable"


class BackpressureTimeout(TransportError):
    """A producer waited longer than its configured patience for space."""

    reason = "backpressure_timeout"


class AccessRefused(TransportError):
    """Authentication or authorisation refused by the broker."""

    reason = "access_refused"


class StopDuringAlarm(TransportError):
    """A stop was requested while the broker blocked publishing (a memory or disk alarm): the
    wait for a confirm is abandoned, and the worker stops without a last checkpoint."""

    reason = "stop_during_alarm"


# --------------------------------------------------------------------------- operations


class StackError(NebulaError):
    """The local broker stack could not be started, probed or stopped."""

    reason = "stack"


class SecurityError(NebulaError):
    reason = "security"


class CertificateError(SecurityError):
    reason = "certificate"
    restart_helps = False


class AuditError(SecurityError):
    """The audit log chain is broken: a line was edited, removed or reordered."""

    reason = "audit_chain"


class DataAccessDenied(SecurityError):
    """A job asked for a dataset its tenant does not own and no valid grant covers."""

    reason = "data_access_denied"
    restart_helps = False


class DataError(NebulaError):
    """A dataset or input file is missing, corrupt or empty."""

    reason = "data"
    restart_helps = False


class WorkerError(NebulaError):
    reason = "worker"


class ModelError(WorkerError):
    """The user's own model, loss, optimizer or data function raised, or returned what a side
    cannot train with: named by side and micro-batch, the framework's own first line kept
    (the whole trace is in the worker's log)."""

    reason = "model"
    restart_helps = False


class PlacementError(WorkerError):
    """A rank started where it cannot run: on a host that is not its own, or while the same
    rank of the same job already runs. Refused before it touches the job's group, store,
    log or status, so the rank that is running goes on undisturbed."""

    reason = "placement"
    restart_helps = False


class DuplicateRegistration(WorkerError, ValueError):
    """A second, different function registered under a role or scenario name already taken
    (``workers.registry``); raised at import."""

    reason = "duplicate_registration"
    restart_helps = False


class CheckpointError(WorkerError):
    reason = "checkpoint"


class TrainingDiverged(WorkerError):
    """Training reached a state it cannot learn from (e.g. a collapsed encoder)."""

    reason = "diverged"


class BrokerDataLost(TransportError):
    """A broker came back without the job: its vhost, users, queues and messages are gone (its
    message store was wiped while it was stopped). Nothing that broker held will arrive, so the
    worker that waits for it stops and names what it needed; waiting would never end."""

    reason = "broker_data_lost"
    restart_helps = False
