"""The boundary between the workload and a client library: every library error becomes a `ClientFailure`.

Adapters translate the errors they know (KafkaException, kafka-python's
KafkaError classes). A library can still raise something else from deep
inside: confluent-kafka's flush() raises `SystemError: _PyErr_SetObject ...`
when a callback misbehaves, kafka-python raises AssertionError or
AttributeError from its own state machines. Such an error says nothing about
what reached the broker, so the operation it interrupted ends `info` (see
`ClientFailure.library_error`) and the process that saw it is retired: the
worker carries on with new clients instead of stopping the run. A
translated error the library calls fatal retires the process the same way,
once its operation is recorded: the client cannot be used again.

Only calls on a client are guarded. Building a client is not: a client that
cannot be built from its settings is a bad setting, which stops the run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kproxy.workload.errors import ClientFailure

log = logging.getLogger(__name__)

C = TypeVar("C")


def library_failure(exc: Exception) -> ClientFailure:
    """An error the adapter did not translate, named by its class."""
    return ClientFailure(type(exc).__name__, library_error=True)


class Guarded:
    """Wraps a producer or consumer adapter; its methods raise only `ClientFailure`."""

    __slots__ = ("_client", "_on_library_error")

    def __init__(self, client: Any, on_library_error: Callable[[], None] = lambda: None) -> None:
        self._client = client
        self._on_library_error = on_library_error

    @property
    def unwrapped(self) -> Any:
        return self._client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            # A guarded client handed to another client's method (a consumer
            # to send_offsets_to_transaction) goes in as the adapter it wraps.
            args = tuple(a.unwrapped if isinstance(a, Guarded) else a for a in args)
            try:
                return attr(*args, **kwargs)
            except ClientFailure as exc:
                if exc.fatal:
                    # The library says this client is done for (fenced, INVALID_TXN_STATE
                    # after a fatal error): every later call would fail the same way.
                    self._on_library_error()
                raise
            except Exception as exc:
                log.warning("client library raised %s in %s: %s", type(exc).__name__, name, exc)
                self._on_library_error()
                raise library_failure(exc) from exc

        return call


def guarded(client: C, on_library_error: Callable[[], None] = lambda: None) -> C:
    """`client` behind the guard; `on_library_error` is told each time the library broke."""
    return Guarded(client, on_library_error)  # type: ignore[return-value]
