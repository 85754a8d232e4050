"""Put an application's own tests through kproxy and judge them from the wire.

`kproxy test -- COMMAND` (kproxy.cli.test) and the pytest plugin
(kproxy.testing.pytest_plugin, fixture `kproxy`) share what is here: a
broker started or named (`harness`), a proxy tracing at level `records` in
front of it, the proxy's admin API from Python (`admin.AdminClient`), and
the verdict of the analysis on the trace alone, with no history
(`verdict.judge`, `verdict.Verdict`). docs/testing.md.

Importing this package is cheap: pytest loads the plugin in every run, so
nothing here imports Spark, trio or a Kafka client until it is used.
"""
