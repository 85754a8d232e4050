"""Stage: clients only ever learn proxy listeners, and versions the proxy can read.

Every response that names brokers (Metadata, FindCoordinator,
DescribeCluster, and leader hints in Produce and Fetch responses) is rewritten
to the proxy's listeners; ApiVersions is capped to what the proxy can decode.
The stage returns the broker ids it learnt of: the shell opens their
listeners before the response goes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kproxy.pipeline.decode import Undecodable
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import (
    ADDRESS_APIS,
    LEADER_HINT_MIN_VERSION,
    AddressMap,
    cap_api_versions,
    rewrite_addresses,
)
from kproxy.protocol.codec import DecodeError, decode_response, encode_response, response_correlation_id


@dataclass(frozen=True, slots=True)
class Rewritten:
    frame: bytes  # what the client gets
    decoded: Any  # the decoded response as the client gets it; None if it could not be read
    new_brokers: tuple[int, ...] = ()  # broker ids first named by this response


def needs_rewrite(ex: Exchange, frame: bytes, addresses: AddressMap) -> bool:
    api_key = ex.api_key
    if api_key in ADDRESS_APIS or api_key == apis.API_VERSIONS:
        return True
    min_version = LEADER_HINT_MIN_VERSION.get(api_key)
    return min_version is not None and ex.api_version >= min_version and addresses.may_name_brokers(frame)


def rewrite_response(ex: Exchange, frame: bytes, addresses: AddressMap, version_caps: dict[int, int]) -> Rewritten:
    payload = frame[4:]
    try:
        decoded = decode_response(ex.api_key, ex.api_version, payload)
    except DecodeError as exc:
        if ex.api_key == apis.API_VERSIONS and ex.api_version > 0:
            # A broker that does not support the client's ApiVersions
            # version answers in v0 format (KIP-511).
            try:
                decoded = decode_response(ex.api_key, 0, payload)
            except DecodeError:
                decoded = None
            if decoded is not None:
                capped = cap_api_versions(decoded, version_caps)
                return Rewritten(encode_response(capped, response_correlation_id(payload)), None)
        if ex.api_key in ADDRESS_APIS:
            raise Undecodable(
                f"{apis.api_name(ex.api_key)} v{ex.api_version} response (its addresses must be rewritten)", exc
            ) from None
        return Rewritten(frame, None)  # leader hints are best effort: pass the response through
    learnt: list[int] = []
    if ex.api_key == apis.API_VERSIONS:
        new = cap_api_versions(decoded, version_caps)
    else:
        new, learnt = rewrite_addresses(decoded, addresses)
    if new is decoded:
        return Rewritten(frame, decoded, tuple(learnt))
    return Rewritten(encode_response(new, ex.correlation_id), new, tuple(learnt))
