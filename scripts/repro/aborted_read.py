"""Aborted read, directly against a broker (no proxy): one transaction aborts,
the next commits, and a read_committed consumer reads the topic from offset 0.

Kafka returns only the committed record. Exit 1 when the aborted one comes back too.
Usage: python scripts/repro/aborted_read.py HOST:PORT
"""

import sys
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
topic = f"repro-aborted-read-{uuid.uuid4().hex[:8]}"
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
consumer.assign([TopicPartition(topic, 0, 0)])
read = []
while (msg := consumer.poll(3)) is not None and not msg.error():
    read.append(msg.value().decode())
consumer.close()
print(f"read_committed from offset 0 returned {read}")
sys.exit(1 if "aborted" in read else 0)
