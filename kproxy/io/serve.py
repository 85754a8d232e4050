"""Run a proxy with its companions (admin HTTP, rule reloads, trace writer) until a signal."""

from __future__ import annotations

import logging
import signal

import trio

from kproxy.io.config import ProxyConfig
from kproxy.io.proxy import Proxy

log = logging.getLogger("kproxy.serve")

SHUTDOWN_GRACE = 5.0


async def serve(config: ProxyConfig, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
    proxy = Proxy(config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            task_status.started(proxy)
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                break
            proxy.shutdown()
            nursery.cancel_scope.cancel()
    log.info("proxy stopped")
