"""Does a broker's binary run on this machine? Asked before any work starts."""

from __future__ import annotations

import subprocess

from kproxy.brokers.process import BrokerError

# A binary that runs answers its version in milliseconds; one that cannot load
# (a missing shared library, a newer glibc) fails at once. The bound is only
# for one that hangs: on a busy machine (two cores under Spark's JIT) a healthy
# Tansu once took over 0.8 s to answer, and the broker it was to start, shared
# by a whole test session, failed every test that used it.
CHECK_TIMEOUT = 10.0


def run_version(kind: str, cmd: list[str], fix: str, prefix: str = "") -> str:
    """Run a version command; return its first output line, without `prefix`, or raise BrokerError naming the fix."""
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=CHECK_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BrokerError(f"the {kind} broker's binary is missing ({cmd[0]}). Fix: {fix}") from None
    except PermissionError:
        raise BrokerError(f"the {kind} broker's binary is not executable ({cmd[0]}). Fix: {fix}") from None
    except OSError as exc:
        raise BrokerError(f"the {kind} broker's binary does not run here ({cmd[0]}: {exc.strerror}). Fix: {fix}") from None
    except subprocess.TimeoutExpired:
        raise BrokerError(f"the {kind} broker's binary did not answer `{' '.join(cmd[1:])}` "
                          f"within {CHECK_TIMEOUT}s ({cmd[0]}). Fix: {fix}") from None
    output = (done.stdout or b"").decode(errors="replace").strip()
    if done.returncode != 0 or not output:
        reason = (done.stderr or b"").decode(errors="replace").strip().splitlines()
        detail = reason[-1] if reason else f"exit status {done.returncode}"
        raise BrokerError(f"the {kind} broker's binary does not run here ({cmd[0]}: {detail}). Fix: {fix}")
    return output.splitlines()[0].removeprefix(prefix).strip()
