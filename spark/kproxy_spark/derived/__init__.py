"""A client history derived from a records-level trace alone.

For an application kproxy did not write (a Kafka Streams topology, a
franz-go service, a Python consume-transform-produce job), the trace is the
only account of what the clients did and were told. `identity` names every
record by what the wire carries on both sides (the producer's id, epoch and
sequence, else its offset); `history` turns the trace into the operations
of docs/history.md, so every history check and wire check runs on it
unchanged. docs/analysis.md, "A history derived from the wire", gives the
rules.
"""
