"""`kproxy shrink`: the search (sans-IO, search.py) and the runs that judge it (runner.py). See docs/shrinking.md."""
