"""JVM options kproxy passes to every JVM it starts for a short job: Spark's driver for a small
analysis, the embedded Kafka broker, the Java client bridge."""

#: The quick JIT tier (such a JVM does little, and the optimising compiler costs it more CPU than it
#: saves), with the code cache the default tiered JIT would have: the quick tier alone gets 48 MB, which
#: a long-lived JVM fills, and the JIT then stops for good, with a warning on stderr.
QUICK_JIT = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
