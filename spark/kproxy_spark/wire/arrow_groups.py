"""Array helpers the wire's grouped passes share (kproxy_spark.wire.log_pass,
cut_off_pass, exactly_once_pass): plain pyarrow and numpy over one group's tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: A producer session's key: the synthetic transaction numbers are counted
#: per (transactional id, producer id, epoch).
TXN_KEY = ("txn_id", "txn_pid", "txn_epoch")


def take_or_null(column: pa.ChunkedArray | pa.Array, index: np.ndarray) -> pa.Array:
    """column[index], null where index is negative."""
    missing = index < 0
    return pc.take(column, pa.array(np.where(missing, 0, index), mask=missing))


def numbers(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False)


def session_ids(*tables: pa.Table) -> list[np.ndarray]:
    """One dense number per producer session, the same in every table."""
    keys = [pc.binary_join_element_wise(*(pc.cast(t.column(c), pa.string()) for c in TXN_KEY), "\x00")
            for t in tables]
    every = pa.concat_arrays([chunk for key in keys for chunk in key.chunks]) if any(k.num_chunks for k in keys) \
        else pa.array([], pa.string())
    ids = numbers(pc.dictionary_encode(every).indices).astype(np.int64)
    return np.split(ids, np.cumsum([t.num_rows for t in tables])[:-1])


def joint(first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    """(group, value) pairs of two sides as one int64 each that sorts as the
    pair does: the values ranked over both sides, below the group."""
    ranks = np.unique(np.concatenate([first[1], second[1]]), return_inverse=True)[1].astype(np.int64)
    size = len(first[1])
    return first[0] << 32 | ranks[:size], second[0] << 32 | ranks[size:]
