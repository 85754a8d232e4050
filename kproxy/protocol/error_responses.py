"""Responses the proxy writes itself, and error codes swapped into real ones.

Two fault actions need them: "respond with an error without forwarding"
(also guard mode refusing a stale EndTxn or a late Produce) builds a whole
response from the decoded request, and "forward, then replace the error code"
rewrites the broker's answer. Both work on kio payloads of any version, so
the shell only encodes the result with `codec.encode_response`.

A built response mirrors the request: every topic, partition, coordinator key,
transaction or member the client asked about comes back carrying the error,
because clients match results to what they sent and treat a missing entry as
a protocol violation. Every other field is what a broker sends alongside an
error: offsets, ids and epochs -1, empty collections, empty record sets,
throttle 0.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kproxy.protocol import apis
from kproxy.protocol.codec import response_type

__all__ = ["MIRRORED_APIS", "UnsupportedErrorResponse", "error_response", "replace_error_codes"]


class UnsupportedErrorResponse(ValueError):
    """No well-formed error response can be built for this API and version."""


# Required integer fields a broker fills with -1 in an error response: unknown
# offsets, timestamps, ids, epochs and coordinator/leader endpoints. Anything
# else numeric is 0 (throttle, counts, flags).
_MINUS_ONE_FIELDS = frozenset(
    {
        "base_offset",
        "offset",
        "committed_offset",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "timestamp",
        "producer_id",
        "producer_epoch",
        "node_id",
        "leader_id",
        "leader_epoch",
        "committed_leader_epoch",
        "controller_id",
        "generation_id",
        "member_epoch",
        "port",
        "preferred_read_replica",
    }
)
# Kafka's "authorized operations were not requested" marker.
_AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

_UNSUPPORTED_VERSION = 35


# ---------------------------------------------------------------- introspection


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else tp), True
    return tp, False


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


@lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(cls)


@lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in _fields(cls))


@lru_cache(maxsize=None)
def _item_cls(cls: type, name: str) -> type:
    """The element class of the collection field `name` of `cls`."""
    for f in _fields(cls):
        if f.name == name:
            tp, _ = _unwrap_optional(f.type)
            if _is_tuple(tp):
                return typing.get_args(tp)[0]
    raise UnsupportedErrorResponse(f"{cls.__module__}.{cls.__name__} has no collection field {name!r}")


def _is_error_field(f: dataclasses.Field) -> bool:
    return f.metadata.get("kafka_type") == "error_code"


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


# ---------------------------------------------------------------- building


def _placeholder(owner: type, f: dataclasses.Field, code: ErrorCode) -> Any:
    """What a broker puts in a required field it has nothing to say about."""
    tp, nullable = _unwrap_optional(f.type)
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "records":
        # An empty record set, never null: librdkafka refuses a negative
        # MessageSetSize in non-flexible Fetch versions.
        return Records(b"")
    if _is_tuple(tp):
        return ()
    if dataclasses.is_dataclass(tp):
        return _blank(tp, code)
    if nullable:
        return None
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"):
        if f.name.endswith("authorized_operations"):
            return tp(_AUTHORIZED_OPERATIONS_OMITTED)
        return tp(-1 if f.name in _MINUS_ONE_FIELDS else 0)
    if kafka_type == "string":
        return ""
    if kafka_type == "bytes":
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return tp.parse(datetime.timedelta(0))
    if kafka_type == "float64":
        return tp(0.0)
    raise UnsupportedErrorResponse(
        f"cannot fill required field {owner.__name__}.{f.name} ({kafka_type or f.type}) of an error response"
    )


def _blank(cls: type, code: ErrorCode, /, **values: Any) -> Any:
    """An instance of `cls` carrying `code` in every error field.

    `values` set fields by name; names `cls` does not have are ignored, so one
    call serves every version of an API (e.g. `name` before topic ids, and
    `topic_id` after).
    """
    kwargs: dict[str, Any] = {}
    for f in _fields(cls):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif _is_error_field(f):
            kwargs[f.name] = code
        elif not _has_default(f):
            kwargs[f.name] = _placeholder(cls, f, code)
    return cls(**kwargs)


def _identity(item: Any, *names: str) -> dict[str, Any]:
    """The fields of a request entry that name it (topic name, topic id, ...)."""
    present = _field_names(type(item))
    return {name: getattr(item, name) for name in names if name in present}


def _topics(
    resp_cls: type,
    collection: str,
    partitions_field: str,
    request_topics: Iterable[Any] | None,
    partition_indexes: Callable[[Any], Iterable[int]],
    code: ErrorCode,
    **partition_values: Any,
) -> tuple[Any, ...]:
    """Per-topic results mirroring the request's topics, every partition failed."""
    topic_cls = _item_cls(resp_cls, collection)
    part_cls = _item_cls(topic_cls, partitions_field)
    index_name = "index" if "index" in _field_names(part_cls) else "partition_index"
    return tuple(
        _blank(
            topic_cls,
            code,
            **_identity(topic, "name", "topic", "topic_id"),
            **{
                partitions_field: tuple(
                    _blank(part_cls, code, **{index_name: index}, **partition_values)
                    for index in partition_indexes(topic)
                )
            },
        )
        for topic in request_topics or ()
    )


# ---------------------------------------------------------------- per API


def _produce(cls: type, req: Any, code: ErrorCode) -> Any:
    responses = _topics(cls, "responses", "partition_responses", req.topic_data,
                        lambda t: (p.index for p in t.partition_data), code)
    return _blank(cls, code, responses=responses)


def _fetch(cls: type, req: Any, code: ErrorCode) -> Any:
    responses = _topics(cls, "responses", "partitions", req.topics,
                        lambda t: (p.partition for p in t.partitions), code)
    return _blank(cls, code, responses=responses)


def _metadata(cls: type, req: Any, code: ErrorCode) -> Any:
    # A request for all topics (null list) gets an empty list: the proxy does
    # not know the topics, and the top-level code (v13+) carries the error.
    topic_cls = _item_cls(cls, "topics")
    topics = tuple(_blank(topic_cls, code, **_identity(t, "name", "topic_id")) for t in req.topics or ())
    return _blank(cls, code, topics=topics)


def _find_coordinator(cls: type, req: Any, code: ErrorCode) -> Any:
    if "coordinators" not in _field_names(cls):
        return _blank(cls, code)
    item = _item_cls(cls, "coordinators")
    return _blank(cls, code, coordinators=tuple(_blank(item, code, key=k) for k in req.coordinator_keys))


def _add_partitions_to_txn(cls: type, req: Any, code: ErrorCode) -> Any:
    if "results_by_topic_v3_and_below" in _field_names(cls):
        results = _topics(cls, "results_by_topic_v3_and_below", "results_by_partition",
                          req.v3_and_below_topics, lambda t: t.partitions, code)
        return _blank(cls, code, results_by_topic_v3_and_below=results)
    txn_cls = _item_cls(cls, "results_by_transaction")
    per_txn = tuple(
        _blank(
            txn_cls,
            code,
            transactional_id=txn.transactional_id,
            topic_results=_topics(txn_cls, "topic_results", "results_by_partition",
                                  txn.topics, lambda t: t.partitions, code),
        )
        for txn in req.transactions
    )
    return _blank(cls, code, results_by_transaction=per_txn)


def _offset_commit(cls: type, req: Any, code: ErrorCode) -> Any:
    """OffsetCommit and TxnOffsetCommit: a code per committed partition."""
    topics = _topics(cls, "topics", "partitions", req.topics,
                     lambda t: (p.partition_index for p in t.partitions), code)
    return _blank(cls, code, topics=topics)


def _offset_fetch(cls: type, req: Any, code: ErrorCode) -> Any:
    # Kafka's "no metadata" is the empty string, and -1 means "no offset".
    no_metadata = {"metadata": ""}
    if "groups" not in _field_names(cls):
        topics = _topics(cls, "topics", "partitions", req.topics,
                         lambda t: t.partition_indexes, code, **no_metadata)
        return _blank(cls, code, topics=topics)
    group_cls = _item_cls(cls, "groups")
    groups = tuple(
        _blank(
            group_cls,
            code,
            group_id=group.group_id,
            topics=_topics(group_cls, "topics", "partitions", group.topics,
                           lambda t: t.partition_indexes, code, **no_metadata),
        )
        for group in req.groups
    )
    return _blank(cls, code, groups=groups)


def _list_offsets(cls: type, req: Any, code: ErrorCode) -> Any:
    topics = _topics(cls, "topics", "partitions", req.topics,
                     lambda t: (p.partition_index for p in t.partitions), code)
    return _blank(cls, code, topics=topics)


def _leave_group(cls: type, req: Any, code: ErrorCode) -> Any:
    if "members" not in _field_names(cls):
        return _blank(cls, code)
    member_cls = _item_cls(cls, "members")
    members = tuple(
        _blank(member_cls, code, member_id=m.member_id, group_instance_id=m.group_instance_id)
        for m in req.members
    )
    return _blank(cls, code, members=members)


def _api_versions(cls: type, req: Any, code: ErrorCode) -> Any:
    if code != _UNSUPPORTED_VERSION:
        return _blank(cls, code)
    # Like a broker, say which ApiVersions versions would work, so the client
    # can retry with one of them instead of giving up.
    low, high = apis.DECODABLE[apis.API_VERSIONS]
    entry = _item_cls(cls, "api_keys")
    api_key_type = next(f.type for f in _fields(entry) if f.name == "api_key")
    keys = (entry(api_key=api_key_type(apis.API_VERSIONS), min_version=api_key_type(low),
                  max_version=api_key_type(high)),)
    return _blank(cls, code, api_keys=keys)


def _top_level_only(cls: type, req: Any, code: ErrorCode) -> Any:
    return _blank(cls, code)


_BUILDERS: dict[int, Callable[[type, Any, ErrorCode], Any]] = {
    apis.PRODUCE: _produce,
    apis.FETCH: _fetch,
    apis.METADATA: _metadata,
    apis.FIND_COORDINATOR: _find_coordinator,
    apis.INIT_PRODUCER_ID: _top_level_only,
    apis.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    apis.ADD_OFFSETS_TO_TXN: _top_level_only,
    apis.END_TXN: _top_level_only,
    apis.TXN_OFFSET_COMMIT: _offset_commit,
    apis.API_KEYS["offset_commit"]: _offset_commit,
    apis.API_KEYS["offset_fetch"]: _offset_fetch,
    apis.API_KEYS["list_offsets"]: _list_offsets,
    apis.API_KEYS["join_group"]: _top_level_only,
    apis.API_KEYS["sync_group"]: _top_level_only,
    apis.API_KEYS["heartbeat"]: _top_level_only,
    apis.API_KEYS["leave_group"]: _leave_group,
    apis.API_VERSIONS: _api_versions,
}

# APIs built from their request entry by entry; everything else with a
# top-level error code gets the generic, top-level-only response.
MIRRORED_APIS = frozenset(_BUILDERS)


def _as_error_code(error_code: int) -> ErrorCode:
    try:
        return ErrorCode(error_code)
    except ValueError:
        raise ValueError(f"unknown Kafka error code {error_code}") from None


def error_response(api_key: int, api_version: int, request: Any, error_code: int) -> Any:
    """A well-formed response to `request` in which every error code is `error_code`.

    Raises UnsupportedErrorResponse (a ValueError) when kio has no response
    schema for the version, or the API has neither a dedicated builder nor a
    top-level error code a generic response could carry.
    """
    code = _as_error_code(error_code)
    cls = response_type(api_key, api_version)
    name = apis.api_name(api_key)
    if cls is None:
        raise UnsupportedErrorResponse(f"no response schema for {name} (api key {api_key}) v{api_version}")
    builder = _BUILDERS.get(api_key)
    if builder is not None:
        return builder(cls, request, code)
    if any(f.name == "error_code" and _is_error_field(f) for f in _fields(cls)):
        return _blank(cls, code)
    raise UnsupportedErrorResponse(
        f"cannot build an error response for {name} (api key {api_key}) v{api_version}: "
        "its errors are per entry only and the proxy has no builder for it"
    )


# ---------------------------------------------------------------- replacing


@lru_cache(maxsize=None)
def _layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(error code fields, fields that may hold nested entities) of `cls`."""
    errors: list[str] = []
    nested: list[str] = []
    for f in _fields(cls):
        if _is_error_field(f):
            errors.append(f.name)
            continue
        tp, _ = _unwrap_optional(f.type)
        if _is_tuple(tp):
            tp = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(tp):
            nested.append(f.name)
    return tuple(errors), tuple(nested)


def _replace(value: Any, code: ErrorCode, only_nonzero: bool) -> Any:
    if isinstance(value, tuple):
        new = tuple(_replace(v, code, only_nonzero) for v in value)
        return new if any(a is not b for a, b in zip(new, value)) else value
    if not dataclasses.is_dataclass(value):
        return value  # None in an optional nested field
    error_fields, nested_fields = _layout(type(value))
    changes: dict[str, Any] = {}
    for name in error_fields:
        current = getattr(value, name)
        if current != code and not (only_nonzero and current == 0):
            changes[name] = code
    for name in nested_fields:
        current = getattr(value, name)
        new = _replace(current, code, only_nonzero)
        if new is not current:
            changes[name] = new
    return dataclasses.replace(value, **changes) if changes else value


def replace_error_codes(response: Any, error_code: int, only_nonzero: bool = False) -> Any:
    """`response` with every error code (top-level and per entry) set to `error_code`.

    With `only_nonzero`, entries that succeeded keep their 0, so only failures
    change their reason. The input is not modified; when nothing changes the
    same object is returned.
    """
    return _replace(response, _as_error_code(error_code), only_nonzero)
