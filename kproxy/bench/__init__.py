"""`kproxy bench`: the proxy measured against a direct connection, side by side in one run."""
