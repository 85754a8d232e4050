"""The exactly-once check's overlap on literal traces, and who it is blamed on.

One transactional producer commits its group's offset of input partition
`in`[0] at 10, then, in its next transaction, at 5: the committed offset goes
back. In a group without members (its consumers assign partitions themselves,
as kproxy's own workload does) that is the clients' doing
(`unowned-partitions`); in a group whose members joined it, nothing on the
wire explains it.
"""

from __future__ import annotations

import pytest

from tests.test_wire_checks import _checks
from tests.test_wire_scenarios import PID, TID, Scenario

pytestmark = pytest.mark.spark

GROUP = "readers"


def offsets_back(members: bool) -> Scenario:
    s = Scenario()
    s.op(0, "ok", "create", [7, "t", 0])
    if members:
        s.exchange("join_group", 3, 1, {"group_id": GROUP}, {"error_code": 0})
    for client, broker, offset in ((1, 1, 10), (2, 2, 5)):
        s.op(0, "invoke", "txn", [["send", 7, client]])
        s.produce(1, 10 * client, [client], base_offset=client - 1, txn=(client, broker))
        s.exchange("txn_offset_commit", 1, 10 * client + 1,
                   {"transactional_id": TID, "producer_id": PID, "producer_epoch": 0, "txn_client": client,
                    "txn_broker": broker, "group_id": GROUP,
                    "partitions": [{"topic": "in", "partition": 0, "committed_offset": offset}]},
                   {"error_code": 0, "partitions": [{"topic": "in", "partition": 0, "error_code": 0}]})
        s.end_txn(1, 10 * client + 2, commit=True, txn=(client, broker))
        s.op(0, "ok", "txn", [["send", 7, [client - 1, client]]])
    return s


@pytest.mark.parametrize("members", [False, True], ids=["no-members", "members"])
def test_a_committed_offset_that_goes_back_is_an_overlap(spark, tmp_path, members):
    [case] = _checks(spark, tmp_path, offsets_back(members), {"exactly-once"})["exactly-once"]
    assert (case["kind"], case["group_id"], case["from_offset"], case["to_offset"]) == ("overlap", GROUP, 5, 10)
    assert case["txn_client"] == 2 and case["rules"] == []
    if members:
        assert case["causes"] == [] and case["cause"]["by"] == "unexplained"
    else:
        assert case["causes"] == ["unowned-partitions"]
        assert case["cause"]["by"] == "client" and case["cause"]["name"] == "unowned-partitions"
