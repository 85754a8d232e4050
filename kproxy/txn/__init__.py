"""Sans-IO transaction tracker: synthetic transaction numbers and hazards."""

from kproxy.txn.events import Delivery, Hazard, ResponseUpdate, TxnRequest
from kproxy.txn.extract import response_update, txn_requests
from kproxy.txn.tracker import TrackerStats, TxnTracker

__all__ = [
    "Delivery",
    "Hazard",
    "ResponseUpdate",
    "TrackerStats",
    "TxnRequest",
    "TxnTracker",
    "response_update",
    "txn_requests",
]
