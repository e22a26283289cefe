"""Stopping long commands on SIGINT or SIGTERM with what they have done so far.

``s2h replay``, ``kitti_replay`` and ``s2h eval`` run for minutes to hours. A user's Ctrl-C
(SIGINT) or a scheduler's ``kill`` (SIGTERM) must end them with the results so far written and
no traceback. :func:`on_stop_signals` calls the command's ``stop(signum)`` on the first SIGINT or
SIGTERM (the replay sets a flag and wakes its waits; ``s2h eval`` raises :class:`Interrupted`)
and puts the previous handlers back at once, so a second signal acts as it did before (Python's
KeyboardInterrupt, termination): a write that hangs can still be stopped. The command then exits
with :func:`exit_status`, 128 + the signal number (130, 143), what shells report for a process
ended by that signal.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop signal arrived (a BaseException, as KeyboardInterrupt: ``except Exception`` around
    one measured call must not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum: int) -> None:
    """A ``stop`` for :func:`on_stop_signals` that ends the work where it is."""
    raise Interrupted(signum)


def exit_status(signum: int) -> int:
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextmanager
def on_stop_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """Call ``stop(signum)`` on the first SIGINT/SIGTERM inside the block (see the module text).

    Signal handlers exist only in the main thread; elsewhere the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def handler(signum: int, _frame) -> None:
        restore()
        stop(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        restore()
