"""A warm analysis engine: one long-lived local Spark session that analyses on request.

Starting Spark and warming its JVM costs a cold `kproxy analyze` 10 to 30
seconds before it reads a byte; loops over the verdict (shrink, the version
matrix, a CI gate over many `kproxy test` runs) pay it every time. `kproxy
engine start` starts one background process (kproxy.engine.server) that
holds a session, runs one small analysis to warm it, and then answers
analyses over a local socket, one at a time, until it has been idle for
`--idle-stop` (kproxy.engine.client finds it; docs/analysis.md, "A warm
engine").
"""
