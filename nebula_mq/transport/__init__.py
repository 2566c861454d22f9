"""Moving encoded envelopes between workers: the only package that imports pika.

``base`` holds the ABCs, ``rabbit`` the RabbitMQ implementation (imports pika
on use), ``memory`` an in-process one for unit tests.
"""

from .base import Consumer, Delivery, Publisher, Transport

__all__ = ["Consumer", "Delivery", "Publisher", "Transport"]
