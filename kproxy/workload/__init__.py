"""Real-client workloads that write a Jepsen-style client history."""
