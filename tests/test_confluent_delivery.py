"""librdkafka's delivery reports as the workload records them.

The callback runs inside librdkafka: anything it raises comes out of
flush() as a SystemError and stops the workload (the ambiguous-not-leader
and spurious-zero-offset scenarios did exactly that when a send was
acknowledged without an offset).
"""

import pytest

from kproxy.workload.clients.base import Delivery
from kproxy.workload.clients.confluent import delivery_reporter


class _Message:
    def __init__(self, offset):
        self._offset = offset

    def offset(self):
        return self._offset


@pytest.mark.parametrize(("reported", "recorded"), [(7, 7), (0, 0), (None, None), (-1001, None)])
def test_an_acknowledged_send_records_its_offset_or_none(reported, recorded):
    delivery = Delivery()
    delivery_reporter(delivery)(None, _Message(reported))
    assert (delivery.done, delivery.offset, delivery.failure) == (True, recorded, None)


def test_a_failed_send_records_the_failure():
    from confluent_kafka import KafkaError

    delivery = Delivery()
    delivery_reporter(delivery)(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), _Message(None))
    assert delivery.done and delivery.failure.name == "NOT_LEADER_FOR_PARTITION" and delivery.offset is None
