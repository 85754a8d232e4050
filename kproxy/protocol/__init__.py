"""Sans-IO Kafka protocol: framing, headers, kio payloads, record batches, rewriting.

Nothing in this package touches sockets, clocks, trio or randomness.
"""
