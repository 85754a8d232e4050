#!/usr/bin/env python3
"""Write a large, clean, Jepsen-style queue history (and its traces); see
kproxy/workload/synthetic.py and docs/performance-analysis.md.

    scripts/synthetic-history.py --ops 1000000 --out h.jsonl --traces traces/
"""

import sys

from kproxy.workload.synthetic import main

if __name__ == "__main__":
    sys.exit(main())
