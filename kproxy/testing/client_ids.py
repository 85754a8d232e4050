"""Client ids kproxy's own clients use in a run it judges, so the analysis can tell their traffic apart.

Kept free of imports: the analysis (kproxy_spark.derived) reads them, and
runs on Spark executors that need no Kafka client.
"""

#: The final reader of `kproxy test` and the pytest plugin (kproxy.testing.final_read): its reads close
#: the history derived from the trace, as Jepsen's final reads do.
FINAL_READER = "kproxy-final-read"
