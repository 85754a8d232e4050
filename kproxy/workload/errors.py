"""Definite (fail) versus indefinite (info) outcomes, following Kafka's error semantics.

A history is only as good as its completions: `fail` promises the operation
took no effect, `info` admits we do not know. Claiming `fail` for a write that
may have landed would make a checker report a phantom anomaly, so anything we
cannot prove definite is `info`. The full table is in docs/history.md.

Client adapters translate their library's exceptions into `ClientFailure`; the
rules below never see a client library.
"""

from __future__ import annotations

from dataclasses import dataclass


# Not frozen: raising through a @contextmanager block sets the exception's
# __traceback__ by assignment, which a frozen dataclass refuses (a commit that
# timed out in a test came out as FrozenInstanceError). Hashed by its fields, as before.
@dataclass(unsafe_hash=True)
class ClientFailure(Exception):
    """A client error, stripped of its library.

    name: Kafka's error name (REQUEST_TIMED_OUT, ...) or librdkafka's local
    name (_MSG_TIMED_OUT, ...); retriable / fatal / txn_requires_abort: the
    flags the client gives (librdkafka's KafkaError flags, or the kafka-python
    error class); enqueued: False when the client refused the record before it
    could be sent (local queue full, bad argument); library_error: the library
    raised something its adapter does not know (a SystemError from a callback,
    an internal assertion), which proves nothing about what the broker saw.
    """

    name: str
    retriable: bool = False
    fatal: bool = False
    txn_requires_abort: bool = False
    enqueued: bool = True
    library_error: bool = False

    def __str__(self) -> str:
        return self.name


# The record never reached a broker, or a broker refused it outright: it is not in the log.
DEFINITE_PRODUCE_ERRORS = frozenset({
    "_QUEUE_FULL",
    "_INVALID_ARG",
    "_MSG_SIZE_TOO_LARGE",
    "_UNKNOWN_TOPIC",
    "_UNKNOWN_PARTITION",
    "_STATE",
    "MSG_SIZE_TOO_LARGE",
    "MESSAGE_TOO_LARGE",
    "MESSAGE_SIZE_TOO_LARGE",  # error 10 as kafka-python and aiokafka name it
    "RECORD_LIST_TOO_LARGE",
    "INVALID_RECORD",
    "CORRUPT_MESSAGE",
    "INVALID_REQUIRED_ACKS",
    "INVALID_TOPIC_EXCEPTION",
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "UNSUPPORTED_VERSION",
    "INVALID_TXN_STATE",
})

AUTHORIZATION_ERRORS = frozenset({
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
})


@dataclass(frozen=True)
class Outcome:
    """The completion type to record and the error text that goes with it."""

    type: str  # "fail" or "info"
    error: str


def classify_produce(failure: ClientFailure) -> Outcome:
    """A non-transactional send that did not come back ok."""
    if failure.library_error:
        return Outcome("info", failure.name)
    if not failure.enqueued or failure.name in DEFINITE_PRODUCE_ERRORS:
        return Outcome("fail", failure.name)
    # Timeouts, retriable errors and fatal idempotence errors (e.g.
    # OUT_OF_ORDER_SEQUENCE_NUMBER) may follow a write that did land.
    return Outcome("info", failure.name)


def classify_in_txn(failure: ClientFailure, aborted: bool) -> Outcome:
    """An error before commit was requested.

    No EndTxn(commit) was sent, so the transaction can never commit: once our
    abort succeeded it is definitely gone. Without a successful abort the
    broker still aborts it (by fencing or by timeout) unless the error hid a
    commit, which cannot happen before we asked for one; but a fenced or fatal
    producer leaves us unable to prove it, so those stay info unless the error
    itself is one Kafka defines as pre-commit (INVALID_TXN_STATE,
    authorization).
    """
    if failure.library_error:
        return Outcome("info", failure.name)
    if aborted or failure.name == "INVALID_TXN_STATE" or failure.name in AUTHORIZATION_ERRORS:
        return Outcome("fail", failure.name)
    return Outcome("info", failure.name)


def classify_commit(failure: ClientFailure, aborted_after: bool) -> Outcome:
    """commit_transaction raised (after any retries of a retriable error).

    Only an error that requires an abort, followed by an abort that succeeded,
    is definite: the client refuses to send EndTxn(commit) in that state. A
    timeout or a retriable error that outlived its retries may have committed.
    """
    if failure.library_error:
        return Outcome("info", failure.name)
    if failure.txn_requires_abort and aborted_after:
        return Outcome("fail", failure.name)
    if failure.name in AUTHORIZATION_ERRORS:
        return Outcome("fail", failure.name)
    return Outcome("info", failure.name)


def classify_read(failure: ClientFailure) -> Outcome:
    """A poll, assign or subscribe that raised: reads write nothing, so the failure is definite.

    Unless the library itself broke: a poll may then have consumed records
    nobody recorded, and the client is not to be trusted again.
    """
    if failure.library_error:
        return Outcome("info", failure.name)
    return Outcome("fail", failure.name)
