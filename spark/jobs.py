"""spark-submit's entry script for the analysis (docs/analysis.md, "On a
Spark cluster"):

    spark-submit --master spark://host:7077 --py-files kproxy-analysis.zip \\
        spark/jobs.py --history H --traces D --out O

spark-submit needs a file to run; the job itself is kproxy_spark.jobs.main,
in the package beside this script.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # This folder holds the kproxy_spark package and the repository root holds
    # kproxy: both importable from a checkout without an install. Shipped
    # packages (--py-files) or an installed kproxy are the same code.
    _here = Path(__file__).resolve().parent
    for _path in (str(_here.parent), str(_here)):
        if _path not in sys.path:
            sys.path.insert(0, _path)

    from kproxy_spark.jobs import main

    sys.exit(main())
