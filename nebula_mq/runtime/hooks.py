"""Cross-cutting concerns as hooks (dramatiq's middleware idea).

The worker loop calls every registered hook at fixed points; metrics, timing,
dead-letter accounting and the audit trail are each one small hook, so the
loop itself stays about training. A hook must be cheap and must not raise:
an exception in a hook is logged and swallowed, never allowed to stop training.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nebula_mq.errors import AuditError
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class MessageEvent:
    """What the loop knows about one message at a hook point."""

    flow: str
    step: int = -1
    micro_batch: int = -1
    message_id: str = ""
    # Sizes before and after compression; 0 when unknown (e.g. sync tokens).
    raw_bytes: int = 0
    wire_bytes: int = 0
    redelivered: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


class Hook:
    """Base hook: override the points you care about."""

    def on_published(self, event: MessageEvent) -> None: ...

    def on_received(self, event: MessageEvent) -> None: ...

    def on_duplicate(self, event: MessageEvent) -> None: ...

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None: ...

    def on_step(self, step: int, values: Mapping[str, float]) -> None: ...

    def on_compute(self, seconds: float) -> None: ...

    def on_wait(self, seconds: float) -> None: ...

    def on_queue_depth(self, queue: str, messages: int, message_bytes: int | None = None) -> None:
        """Ready messages in a queue the worker reads, and their bytes when the broker says
        (sampled every few seconds). Called on the queue sampler's thread
        (``runtime.sampler``), not the training loop's: a hook that keeps state here guards it."""

    def close(self) -> None:
        """The worker is exiting: flush and release what the hook holds."""


class Hooks(Hook):
    """Fans every call out to a list of hooks, isolating their failures (all but an
    :class:`~nebula_mq.errors.AuditError`: a record the audit log lost stops the worker)."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self.hooks = list(hooks)

    def add(self, hook: Hook) -> None:
        self.hooks.append(hook)

    def _fan(self, name: str, *args: Any) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, name)(*args)
            except AuditError:
                raise  # an audit record that cannot be written stops the worker: nothing goes unaudited
            except Exception:  # noqa: BLE001 - a broken hook must not stop training
                log.exception("hook_failed", hook=type(hook).__name__, point=name)

    def on_published(self, event: MessageEvent) -> None:
        self._fan("on_published", event)

    def on_received(self, event: MessageEvent) -> None:
        self._fan("on_received", event)

    def on_duplicate(self, event: MessageEvent) -> None:
        self._fan("on_duplicate", event)

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None:
        self._fan("on_dead_letter", event, reason, detail)

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        self._fan("on_step", step, values)

    def on_compute(self, seconds: float) -> None:
        self._fan("on_compute", seconds)

    def on_wait(self, seconds: float) -> None:
        self._fan("on_wait", seconds)

    def on_queue_depth(self, queue: str, messages: int, message_bytes: int | None = None) -> None:
        self._fan("on_queue_depth", queue, messages, message_bytes)

    def close(self) -> None:
        self._fan("close")
