"""s2h_ros.handover: the newest-wins slot, preparation ahead on a second thread, order and drops;
the low-priority helper process, replaced when it dies and ending with its parent."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from s2h_ros.handover import MALLOC_ARENAS, Failed, Handover, in_low_priority_process


class _Recorder:
    """A process callable that can be held (to make the worker busy) and records what it saw."""

    def __init__(self) -> None:
        self.seen: list = []
        self.behind: list[bool] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.handover: Handover | None = None

    def __call__(self, item) -> None:
        self.started.set()
        self.gate.wait(10)
        self.behind.append(self.handover.waiting())
        self.seen.append(item)


def _make(prepare=lambda x: ("prepared", x)):
    rec = _Recorder()
    handover = Handover(prepare, rec)
    rec.handover = handover
    return handover, rec


def _wait_for(condition, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


def test_every_item_offered_one_at_a_time_is_prepared_and_processed_in_order():
    handover, rec = _make()
    for i in range(20):
        handover.offer(i, wait=True)
    assert handover.join(10)
    handover.stop()
    assert rec.seen == [("prepared", i) for i in range(20)]
    assert handover.dropped == 0


def test_while_the_worker_is_busy_the_newest_item_is_prepared_ahead_and_older_ones_dropped():
    prepared: list[int] = []
    handover, rec = _make(lambda x: prepared.append(x) or x)
    rec.gate.clear()
    handover.offer(0)
    rec.started.wait(10)  # the worker holds item 0
    handover.offer(1)
    _wait_for(lambda: prepared == [0, 1])  # item 1 prepared while 0 is processed
    assert not handover.offer(2)  # the offered slot was empty: nothing dropped
    assert handover.offer(3)  # 2 was still waiting: dropped, never prepared
    assert handover.offer(4)
    rec.gate.set()
    assert handover.join(10)
    handover.stop()
    assert rec.seen == [0, 1, 4]
    assert prepared == [0, 1, 4]
    assert handover.dropped == 2
    assert rec.behind == [True, True, False]  # a newer item waited while 0 and 1 were processed


def test_a_failing_preparation_is_handed_on_in_order_and_the_next_items_go_on():
    def prepare(x):
        if x == 1:
            raise ValueError("bad scan")
        return x

    handover, rec = _make(prepare)
    for i in range(3):
        handover.offer(i, wait=True)
    assert handover.join(10)
    handover.stop()
    assert rec.seen[0] == 0 and rec.seen[2] == 2
    failed = rec.seen[1]
    assert isinstance(failed, Failed) and failed.item == 1 and str(failed.error) == "bad scan"


def test_stop_ends_both_threads_even_with_nothing_offered():
    handover, _ = _make()
    handover.stop(timeout=5)
    assert not any(t.is_alive() for t in handover._threads)


def test_without_ahead_nothing_is_prepared_while_the_worker_is_busy():
    prepared: list[int] = []
    rec = _Recorder()
    handover = Handover(lambda x: prepared.append(x) or x, rec, ahead=False)
    rec.handover = handover
    rec.gate.clear()
    handover.offer(0)
    rec.started.wait(10)
    handover.offer(1)
    handover.offer(2)  # 1 dropped: still waiting, not prepared
    assert not handover.join(0.05) and prepared == [0]
    rec.gate.set()
    assert handover.join(10)
    handover.stop()
    assert prepared == [0, 2] and rec.seen == [0, 2] and handover.dropped == 1


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_the_next_preparation_starts_overlap_of_a_typical_one_before_the_worker_is_expected_to_finish(overlap):
    prepare_s, process_s = 0.15, 0.3
    prepare_starts: list[float] = []
    process_starts: list[float] = []

    def prepare(x):
        prepare_starts.append(time.monotonic())
        time.sleep(prepare_s)  # the work itself
        return x

    def process(x):
        process_starts.append(time.monotonic())
        time.sleep(process_s)

    handover = Handover(prepare, process, overlap=overlap)
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # a sensor far faster than the worker: there is always a newest item
        handover.offer(object())
        time.sleep(0.005)
    handover.stop()
    # Item k+1's preparation starts during item k's processing, once both durations are known.
    leads = sorted(prep - start for start, prep in zip(process_starts[1:], prepare_starts[2:]))
    assert len(leads) >= 4
    median = leads[len(leads) // 2]
    assert median == pytest.approx(process_s - overlap * prepare_s, abs=0.05)


def test_an_overlap_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="overlap"):
        Handover(lambda x: x, lambda x: None, overlap=1.5)


_ARENAS_SCRIPT = r"""
import ctypes, ctypes.util, sys, threading
from s2h_ros.handover import limit_malloc_arenas
if sys.argv[1] == "limited":
    assert limit_malloc_arenas()
start = threading.Barrier(8)
def allocate():
    start.wait()
    for _ in range(200):
        kept = [bytearray(2000) for _ in range(500)]
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_stats")
def test_threads_allocating_at_once_share_the_limited_malloc_arenas():
    """Eight threads allocating at once: glibc gives them arenas of their own unless the process
    limited them (as registration_node and s2h bench stream do), each keeping what its thread freed."""
    arenas = {}
    for mode in ("limited", "default"):
        done = subprocess.run([sys.executable, "-c", _ARENAS_SCRIPT, mode], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        arenas[mode] = done.stderr.count("Arena ")
    assert arenas["limited"] <= MALLOC_ARENAS < arenas["default"], arenas


def test_a_killed_helper_process_is_replaced_by_the_next_call():
    pid = in_low_priority_process(os.getpid).result(timeout=120)
    os.kill(pid, signal.SIGKILL)
    replaced = None
    for _ in range(2):  # a call made before the pool saw the death fails with it; the next starts another
        try:
            replaced = in_low_priority_process(os.getpid).result(timeout=120)
            break
        except BrokenProcessPool:
            continue
    assert replaced is not None and replaced != pid


_HELPER_SCRIPT = """
import sys
from s2h_ros.handover import helper_process_pid, start_helper_process
start_helper_process()
print(helper_process_pid(), flush=True)
sys.stdin.read()  # until killed
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for the helper's end through a Linux pidfd")
def test_the_helper_process_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _HELPER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        helper = int(parent.stdout.readline())
        handle = os.pidfd_open(helper)
    finally:
        parent.kill()
        parent.wait(timeout=60)
    try:
        ended, _, _ = select.select([handle], [], [], 60)
        assert ended, f"helper process {helper} still runs 60 s after its parent was killed"
    finally:
        os.close(handle)


_UNGUARDED_SCRIPT = """
from s2h_ros.local_map import LocalMap
print("top level ran", flush=True)
local = LocalMap(0.5, 2)
print(local.where(), flush=True)
"""


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_without_a_main_guard_gets_the_helper_and_runs_once(how, tmp_path):
    """The helper process does not import the program's main script again: an unguarded script (as
    an installed entry point was) would run its top level in there, and one read from standard
    input could not be found."""
    if how == "file":
        script = tmp_path / "unguarded.py"
        script.write_text(_UNGUARDED_SCRIPT)
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    else:
        run = subprocess.run([sys.executable, "-"], input=_UNGUARDED_SCRIPT, capture_output=True, text=True,
                             timeout=300)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["top level ran", "helper process"], run.stdout + run.stderr[-3000:]
