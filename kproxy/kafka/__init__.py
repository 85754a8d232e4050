"""Apache Kafka itself: its jars (from a download or Maven Central) and a local KRaft cluster.

`jars` finds or resolves the broker's and the Java client's jars into a
per-version cache; `kraft` runs one or more KRaft nodes on loopback from them.
"""
