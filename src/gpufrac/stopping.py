"""How every long-running gpufrac process learns to stop: SIGTERM (from the kubelet) or SIGINT (a person)."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, for the running loop; the process then shuts down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    return stop
