"""Stale aborted entry, directly against a broker (no proxy): one transaction
aborts (record at offset 0, abort marker at 1), the next commits (record at
2, commit marker at 3), and a read_committed consumer reads from offset 2.

Kafka lists in a Fetch response only the aborted transactions that overlap
the fetched range, so the committed record comes back. A broker that also
lists the transaction aborted before offset 2 makes librdkafka treat the
producer as aborted with no abort marker to clear it, and drop the committed
record. Exit 1 when the committed record does not come back.
Usage: python scripts/repro/stale_aborted_entry.py HOST:PORT
"""

import sys
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
topic = f"repro-stale-aborted-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)

producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
producer.init_transactions(15)
for value, commit in ((b"aborted", False), (b"committed", True)):
    producer.begin_transaction()
    producer.produce(topic, value)
    producer.flush(15)
    producer.commit_transaction(15) if commit else producer.abort_transaction(15)

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "isolation.level": "read_committed",
                     "enable.auto.commit": False})
consumer.assign([TopicPartition(topic, 0, 2)])
read = []
while (msg := consumer.poll(3)) is not None and not msg.error():
    read.append((msg.offset(), msg.value().decode()))
consumer.close()
print(f"read_committed from offset 2 returned {read}")
sys.exit(0 if read == [(2, "committed")] else 1)
