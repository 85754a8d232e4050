"""kproxy: a Kafka protocol proxy and fault-injection gateway."""

__version__ = "0.1.0"
