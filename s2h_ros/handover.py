"""The newest-scan hand-over between a sensor and the odometry, in two stages on two threads (no ROS).

A sensor offers scans at its rate; the odometry takes longer per scan than the sensor's period
whenever it is behind. What it should register next is the newest scan, not the oldest, so scans
wait in a one-slot buffer where a newer one replaces (drops) an older one. Registration has two
halves: preparing a scan (voxels, FCGF features, the local map's copy: ``KeyframeOdometry.prepare``,
which reads no odometry state) and registering it (``KeyframeOdometry.step``). Here they run on two
threads: while the worker registers scan k, the preparer prepares the newest scan offered since,
and then waits with it (one prepared scan at most), so the worker starts on a prepared scan as soon
as it is free. A CPU's second core and a GPU's idle time while the CPU registers are used; the
features of a scan that is then replaced by a newer one are never computed. The preparer starts
*just in time*: when the worker is expected to finish (it started its item a typical processing
time ago, the median of the last ones) less a typical preparation, so that it takes the newest
scan offered by then, not the one offered right after the worker started (which would be a step
older when registered).

``ahead=False`` prepares an item only once the worker is free: one scan at a time, as one thread
would (registration_node's ``prepare_ahead``; ``s2h bench stream --no-prepare-ahead``). Measured
on the 2-core VM at 10 Hz (docs/performance.md): in process, ahead takes 1.2-1.4x the scans per
second; over DDS with the replayer on the same two cores 1.2x on a VLP-32 drive and 0.9x on an
HDL-64 one (the second core is not free there); the latency grows by about 100 ms at p50.

Between the two, ``overlap`` (registration_node's ``prepare_overlap``) is the fraction of a typical
preparation that may run beside the worker's item: 1 starts the preparer a whole typical
preparation before the worker is expected to finish (the most items per second where the two
threads do not slow each other), 0 when it finishes (``ahead=False``'s latency, but without
waiting for the worker to say so). On a CPU whose two threads share the memory bandwidth each
runs 1.4-1.7x slower beside the other, and the scan prepared beside a registration is late by
that much; a smaller overlap trades scans per second for latency (docs/performance.md, "How much
of the next scan's preparation runs beside the registration").

Written here rather than taken from a library: ``queue.Queue`` drops nothing and keeps the oldest
first; this is the newest-wins slot, a second slot for the prepared scan, and the rule between them.

Work that a keyframe starts off the scans' path runs on a helper thread (``in_background``) or,
for the local map, in one low-priority helper process (``in_low_priority_process``: the standard
library's process pool with a spawned worker; what is written here is its priority, its single
thread and its end with the node).
"""
from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


# How many recent durations a typical preparation / processing time is the median of.
TYPICAL_OF = 10


@dataclass
class Failed:
    """What the preparer hands on when ``prepare`` raised: the offered item and the exception."""

    item: Any
    error: BaseException


class Handover:
    """``offer(item)`` from the sensor's side; ``prepare(item)`` runs on the preparer thread and
    ``process(prepared)`` (a :class:`Failed` where ``prepare`` raised) on the worker thread, in the
    order the items were taken. ``process`` must not raise: an exception there ends the worker."""

    def __init__(self, prepare: Callable[[Any], Any], process: Callable[[Any], None], name: str = "handover",
                 ahead: bool = True, overlap: float = 1.0) -> None:
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap {overlap}: a fraction of a typical preparation, 0-1")
        self._prepare, self._process = prepare, process
        self.ahead = ahead  # False: the preparer waits until the worker is free (one scan at a time)
        self.overlap = overlap  # of a typical preparation, run beside the worker's item (module text)
        self._cv = threading.Condition()
        self._offered: Any = None  # the newest offered item not yet taken by the preparer
        self._has_offered = False
        self._ready: Any = None  # the prepared item waiting for the worker
        self._has_ready = False
        self._busy = 0  # items taken by the preparer and not yet processed
        self._stop = False
        self._processing_since: float | None = None  # monotonic start of the worker's item
        self._durations = {"prepare": deque(maxlen=TYPICAL_OF), "process": deque(maxlen=TYPICAL_OF)}
        self.offered = self.dropped = 0
        self._threads = [threading.Thread(target=self._preparer, name=f"{name}_prepare", daemon=True),
                         threading.Thread(target=self._worker, name=f"{name}_process", daemon=True)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ the sensor's side
    def offer(self, item: Any, wait: bool = False) -> bool:
        """Offer a new item; True when it replaced (dropped) one still waiting. ``wait``: block until
        the slot is free instead (lock-step: every item, in order, none dropped)."""
        with self._cv:
            if wait:
                self._cv.wait_for(lambda: not self._has_offered or self._stop)
            replaced = self._has_offered
            self._offered, self._has_offered = item, True
            self.offered += 1
            self.dropped += replaced
            self._cv.notify_all()
            return replaced

    def waiting(self) -> bool:
        """Whether an item newer than the one being processed waits (offered, being prepared or
        prepared): what ``process`` asks to know that it is behind."""
        with self._cv:
            return self._has_offered or self._busy > 1

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every item offered so far is processed or dropped; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not (self._has_offered or self._busy), timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop both threads (an item being processed is finished first, up to ``timeout``)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the two threads
    def _start_at(self) -> float:
        """When the preparer should take the next item (monotonic): now when the worker is idle or
        nothing is known yet, else when the worker is expected to finish less ``overlap`` of a
        typical preparation (never while it works, without ``ahead``)."""
        if self._processing_since is None:
            return 0.0
        if not self.ahead:
            return math.inf
        if not self._durations["process"] or not self._durations["prepare"]:
            return 0.0
        typical = {k: statistics.median(v) for k, v in self._durations.items()}
        return self._processing_since + typical["process"] - self.overlap * typical["prepare"]

    def _preparer(self) -> None:
        while True:
            with self._cv:
                while True:
                    self._cv.wait_for(lambda: self._stop or (self._has_offered and not self._has_ready))
                    if self._stop:
                        return
                    early = self._start_at() - time.monotonic()
                    if early <= 0:
                        break
                    self._cv.wait(None if math.isinf(early) else early)  # the newest item by then is taken
                item, self._offered, self._has_offered = self._offered, None, False
                self._busy += 1
                self._cv.notify_all()  # a lock-step offer may go on
            started = time.monotonic()
            try:
                prepared = self._prepare(item)
            except BaseException as exc:  # handed on: the worker answers it in order
                prepared = Failed(item, exc)
            with self._cv:
                self._durations["prepare"].append(time.monotonic() - started)
                self._ready, self._has_ready = prepared, True
                self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._has_ready)
                if self._stop:
                    return
                prepared, self._ready, self._has_ready = self._ready, None, False
                self._processing_since = time.monotonic()
                self._cv.notify_all()  # the preparer may take the next item
            try:
                self._process(prepared)
            finally:
                with self._cv:
                    self._durations["process"].append(time.monotonic() - self._processing_since)
                    self._processing_since = None
                    self._busy -= 1
                    self._cv.notify_all()


# glibc malloc arenas a process with these threads keeps (``limit_malloc_arenas``).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Let glibc's malloc keep at most ``arenas`` arenas in this process; True where it could (glibc,
    Linux), False elsewhere (nothing changed). Call it before the threads start. glibc gives a
    thread that allocates while another holds an arena one of up to 8 per core, and each keeps
    the memory its thread freed; the node's preparer, worker and helper threads then held about
    twice the memory they use. Measured over DDS (``s2h bench robustness --soak-minutes 5``, the
    10 Hz 64-beam drive, 2-core VM, docs/performance.md): node RSS 514 -> 1096 MB (max 1171) with
    glibc's default, 479 -> 658 MB (max 733) with ``MALLOC_ARENA_MAX=2`` in its environment, 521 ->
    762 MB (max 774) with this call in the node; the processed rate in process (held-out HDL-64
    world 924 at 10 Hz, `config/cpu.yaml`, 2 runs each) 5.22 / 4.70 against 4.91 / 5.22 scans/s."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    return bool(mallopt is not None and mallopt(_M_ARENA_MAX, int(arenas)) == 1)


def in_background(fn: Callable[..., Any], *args: Any, name: str = "background") -> Future:
    """``fn(*args)`` started now on a helper thread; the future's ``result()`` waits for it and
    returns its value or raises its exception (the odometry's keyframe and local-map work, started
    when a keyframe is made and waited for where the next scans need it).

    The thread is not a daemon: a process that ends while it runs waits for it (a keyframe's work,
    well under a second). A daemon thread inside Open3D when the interpreter shuts down is torn down
    in C++ code and aborts the process ("terminate called without an active exception", exit status
    134: measured with a local map built as the process ended)."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits for the result
                future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=False).start()
    return future


# The helper process's niceness: Linux weighs a nice-5 process at 335 against 1024 for the node's
# own threads, so where they keep every core busy it takes about a quarter of one. Held-out HDL-64
# drive at 10 Hz on the 2-core VM (docs/performance.md, "The local map in a low-priority process"):
# niceness 0, 5, 10 and 19 within the runs' spread in rate and latency, but the higher, the more
# often a scan's map was a keyframe behind (15, 30, 50, 70 % of the scans).
HELPER_NICE = 5
_helper: ProcessPoolExecutor | None = None
_helper_lock = threading.Lock()


def in_low_priority_process(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in the helper process: one process for the whole program, started on first use
    (:func:`start_helper_process`), at niceness ``HELPER_NICE`` (added to this process's), one thread, exiting when this
    process does. ``fn`` is a module-level function and ``args`` are pickled there and back (a local
    map's keyframe scans, a few MB). The future raises ``BrokenProcessPool`` when the process died
    (the next call starts another).

    Why a process and not a thread: on the CPU, Open3D's neighbour searches hold the interpreter
    lock for the whole call (a local map's 0.2 s of them stalled the scan's threads), and a thread's
    share of the cores cannot be lowered below theirs. Forked children of a process with threads
    (torch, DDS) may deadlock, so the process is spawned: it imports the library again (about 3 s,
    about 250 MB resident, most of it the shared libraries' pages that the node maps too), but not
    the program's main script (``_main_script_hidden``)."""
    global _helper
    with _helper_lock, _main_script_hidden():
        try:
            return _helper_pool().submit(fn, *args)
        except BrokenProcessPool:  # the process died since the last call: start another
            _helper = None
            return _helper_pool().submit(fn, *args)


@contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While a helper process is spawned (the pool starts it inside ``submit``), the main module
    shows neither its file nor its spec, as under ``python -c``: a spawned process would otherwise
    import the program's main script again. The helper runs only functions of this library and
    needs nothing of it, and a script without a ``__main__`` guard would run again in there (an
    installed node's entry point did: the helper started a second node and died), or, read from
    standard input, could not be found at all."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    hidden = {name: main.__dict__.pop(name) for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(hidden)


def _helper_pool() -> ProcessPoolExecutor:
    global _helper
    if _helper is None:
        _helper = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=_helper_started, initargs=(HELPER_NICE,))
    return _helper


def start_helper_process(*modules: str, optional: tuple[str, ...] = ()) -> Future:
    """Start the helper process now and import ``modules`` there (e.g. "s2h_ros.local_map"), and
    ``optional`` ones where they are installed (e.g. "open3d"), so that the first work does not pay
    for them; the future is done, with the helper's pid, when they are imported (and raises what
    an import of ``modules`` raised). A spawn and its imports cost about 4 s of CPU on the 2-core VM."""
    return in_low_priority_process(_import_modules, modules, optional)


def _import_modules(modules: tuple[str, ...], optional: tuple[str, ...]) -> int:
    import importlib

    for module in modules:
        importlib.import_module(module)
    for module in optional:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    return os.getpid()


def helper_process_pid() -> int | None:
    """The helper process's pid, None when it was never started (waits until it runs)."""
    return None if _helper is None else in_low_priority_process(os.getpid).result()


def _helper_started(nice: int) -> None:
    """In the helper process, before any work: one thread for torch, OpenMP and BLAS (read as
    they load, after this), the niceness, Ctrl-C left to its parent (a terminal sends it to the
    whole process group; the parent's exit ends the helper), and a watch that ends it when its
    parent ends (killed included: a spawned pool's worker would otherwise wait for work for ever)."""
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(nice)
    except OSError:  # not permitted here: the same work at the node's priority
        pass
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), daemon=True).start()


def _exit_with_parent(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
