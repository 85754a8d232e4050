"""scripts/kafka-matrix.py on two of its cells: each cell names the protocol its client spoke, read from the trace.

Kafka 4.4.0 with transaction version 2, the torn-transaction scenario:
franz-go sends EndTxn v5 and its epoch moves at every commit, so the broker
fences the stale copies; Sarama sends EndTxn below v5 with one epoch for all
its transactions, so the broker takes them. A second run of the same command
finds both cells done and runs nothing. One Kafka start and two analyses
(several minutes on a loaded machine): with the slow tests, like the full
matrix (docs/kafka-versions.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "kafka-matrix.py"
sys.path.insert(0, str(SCRIPT.parent))

from matrix_wire import speaks_tv2

COMMAND = [sys.executable, str(SCRIPT), "--brokers", "4.4.0:tv2", "--clients", "franz-go,sarama",
           "--scenarios", "torn-transaction", "--seeds", "1", "--guard", "off"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_cells_name_the_protocol_their_client_spoke(tmp_path: Path) -> None:
    out = tmp_path / "matrix"
    done = subprocess.run([*COMMAND, "--out", str(out)], capture_output=True, text=True, timeout=1700, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = {c["client"]: c for c in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    assert set(cells) == {"franz-go", "sarama"}
    franz, sarama = cells["franz-go"], cells["sarama"]
    assert "failed" not in franz and "failed" not in sarama, (franz.get("failed"), sarama.get("failed"))

    assert max(franz["wire"]["versions"]["end_txn"]) >= 5 and speaks_tv2(franz["wire"]) is True
    assert franz["wire"]["epoch"]["commit"]["same"] == 0 and franz["wire"]["epoch"]["commit"]["moved"] >= 1
    assert "add_partitions_to_txn" not in franz["wire"]["versions"]  # KIP-890 part 2 adds partitions implicitly
    assert "PRODUCER_FENCED" in franz["copies"]["end_txn"] and "accepted (NONE)" not in franz["copies"]["end_txn"]
    assert franz["counts"]["torn-transaction"] == 0

    assert max(sarama["wire"]["versions"]["end_txn"]) < 5 and speaks_tv2(sarama["wire"]) is False
    assert sarama["wire"]["epoch"]["commit"]["moved"] == 0 and sarama["wire"]["epoch"]["commit"]["same"] >= 1
    assert sarama["copies"]["end_txn"].get("accepted (NONE)", 0) >= 1

    table = subprocess.run([*COMMAND, "--out", str(out), "--table"], capture_output=True, text=True, timeout=120,
                           check=True).stdout
    assert "**fenced**" in table and "TV2 (epoch moved at every commit)" in table and "not TV2" in table

    again = subprocess.run([*COMMAND, "--out", str(out)], capture_output=True, text=True, timeout=120, check=True)
    assert "0 cells to run (2 of 2 already in" in again.stderr
    assert len((out / "cells.jsonl").read_text().splitlines()) == 2
