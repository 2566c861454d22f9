"""The local stack: TLS-only RabbitMQ nodes (one per cluster), federation, the emulated WAN.

Never imports pika: only ``nebula_mq.transport`` talks AMQP.
"""

from nebula_mq.stack.layout import DEFAULT_BASE_PORT, DEFAULT_CLUSTERS, StackLayout, default_run_dir, plan
from nebula_mq.stack.local import NodeStatus, QueueDepth, Stack
from nebula_mq.stack.relay import Shape

__all__ = [
    "DEFAULT_BASE_PORT", "DEFAULT_CLUSTERS", "NodeStatus", "QueueDepth", "Shape", "Stack",
    "StackLayout", "default_run_dir", "plan",
]
