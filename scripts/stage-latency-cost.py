#!/usr/bin/env python3
"""What per-stage latency costs a request off the fast path: CPU per exchange with and without it.

Runs a transactional producer's exchanges (AddOffsetsToTxn, a transactional
Produce, EndTxn, and their answers) through kproxy.pipeline, without sockets,
rounds alternating off and on, and prints the median CPU microseconds per
exchange of each and their difference. Fast-path frames never pass a stage,
so for them the cost is nil by construction.

    .venv/bin/python scripts/stage-latency-cost.py [ROUNDS] [EXCHANGES]
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import timedelta

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from kproxy.faults.engine import FaultEngine
from kproxy.faults.model import RuleFile
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.path import Pipeline
from kproxy.pipeline.timing import StageTimer
from kproxy.protocol import apis
from kproxy.protocol.codec import encode_request, encode_response, parse_request_header
from kproxy.protocol.broker_addresses import AddressMap
from kproxy.txn.tracker import TxnTracker

NO_TIME = i32Timedelta.parse(timedelta(0))


def frames() -> list[tuple[int, int, bytes, bytes]]:
    add = load_request_schema(apis.ADD_OFFSETS_TO_TXN, 3)(
        transactional_id="tx", producer_id=1, producer_epoch=0, group_id="g")
    end = load_request_schema(apis.END_TXN, 3)(transactional_id="tx", producer_id=1, producer_epoch=0, committed=True)
    add_answer = load_response_schema(apis.ADD_OFFSETS_TO_TXN, 3)(throttle_time=NO_TIME, error_code=ErrorCode.none)
    end_answer = load_response_schema(apis.END_TXN, 3)(throttle_time=NO_TIME, error_code=ErrorCode.none)
    return [
        (apis.ADD_OFFSETS_TO_TXN, 3, encode_request(add, 1, "c"), encode_response(add_answer, 1)),
        (apis.END_TXN, 3, encode_request(end, 2, "c"), encode_response(end_answer, 2)),
    ]


def run(path: Pipeline, exchanges: int, pairs: list[tuple[int, int, bytes, bytes]]) -> float:
    started = time.process_time()
    for i in range(exchanges // len(pairs)):
        for api_key, version, request, answer in pairs:
            ex = Exchange(api_key, version, i, "c", 0.0)
            ex.header = parse_request_header(request, 4)
            ex.request_frame = request
            path.on_request(ex, 0.0)
            path.on_delivery(ex, 0.0)
            path.on_answer(ex, answer, path.response_plan(ex, 0.0), 0.0)
    return (time.process_time() - started) / exchanges * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    exchanges = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    pairs = frames()
    results: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
            timer = StageTimer(time.perf_counter) if name == "on" else None
            path = Pipeline(FaultEngine(RuleFile(version=1)), TxnTracker(), AddressMap("127.0.0.1", 19100), {}, {},
                            guard=False, timer=timer)
            results[name].append(run(path, exchanges, pairs))
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    print(f"CPU per exchange off the fast path, median of {rounds} rounds of {exchanges}: "
          f"off {off:.2f} us, on {on:.2f} us, stage latency costs {on - off:+.2f} us ({(on / off - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
