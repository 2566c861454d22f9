"""Moving encoded envelopes between workers: the only package that imports pika.

``base`` holds the ABCs, ``rabbit`` the RabbitMQ implementation (imports pika
on use), ``memory`` an in-process one for unit tests, ``dedup`` the repeat
filter consumers keep in their checkpoints.
"""

from .base import Consumer, Delivery, Publisher, Transport
from .dedup import Deduplicator

__all__ = ["Consumer", "Delivery", "Deduplicator", "Publisher", "Transport"]
