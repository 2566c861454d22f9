"""nebula-mq: collaborative deep-learning training across clusters over message queues.

Layers, bottom to top: ``codecs`` and ``wire`` (pure numpy/msgpack), ``transport``
(the only pika user), ``runtime`` (worker loop and hooks), ``models`` (Paddle),
the role modules in the top-level ``workers`` package, and ``cli``.
"""

__version__ = "0.1.0"
