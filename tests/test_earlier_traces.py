"""An output directory used again (`kproxy demo --out`, `kproxy test --out`)
is refused before anything starts: the analysis reads every trace file in
OUT/traces, so the earlier run's would be judged with this run's history."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.demo import run_demo
from kproxy.obs.trace_files import EarlierTracesError


def _earlier(out: Path) -> None:
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "trace-p-20261127T070000-000000.events").write_bytes(b"x")


def test_the_demo_refuses_an_out_holding_an_earlier_runs_traces(tmp_path: Path) -> None:
    _earlier(tmp_path)
    with pytest.raises(EarlierTracesError, match="holds the traces of an earlier run"):
        run_demo("torn-transaction", tmp_path, say=print, progress=False)
    assert [p.name for p in (tmp_path / "traces").iterdir()] == ["trace-p-20261127T070000-000000.events"]


def test_kproxy_demo_says_so_and_exits_2(tmp_path: Path) -> None:
    _earlier(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kproxy", "demo", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "holds the traces of an earlier run" in done.stderr, done.stderr
