"""Process faults of the long-running commands, each with one outcome:

* ``kill -9`` of ``s2h replay``: the registration_node it started dies too (PR_SET_PDEATHSIG),
  instead of publishing on into the next run;
* SIGINT / SIGTERM to ``s2h replay`` or ``kitti_replay`` mid-run: exit 130 / 143, no traceback,
  strict-JSON metrics of the scans answered so far, and the plot;
* SIGINT / SIGTERM to ``s2h eval``: exit 130 / 143 with the partial table on stdout and the
  partial ``--json`` / ``--markdown`` written;
* a read-only output folder: one stderr line naming it, exit 2, before any work; a full one (a
  tiny tmpfs): the results on stdout, one stderr line naming the file that could not be written.

Every wait is for a condition with a deadline (results seen over DDS, a line in a file, a process
gone), never a fixed sleep.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from s2h_ros.benchmarks.robustness import ResultCounter, poll_until, process_running
from s2h_ros.commands.replay import node_command

ROOT = Path(__file__).resolve().parents[1]
S2H = str(ROOT / ".venv" / "bin" / "s2h")
KITTI_REPLAY = str(ROOT / ".venv" / "bin" / "kitti_replay")
DOMAIN = 90 + os.getpid() % 50  # apart from test_replay (20-89) and test_registration_node (150-229)


def _no_nan(text: str):
    raise AssertionError(f"{text} in a JSON file: JSON has no NaN/Infinity")


def _strict_json(path: Path) -> dict:
    return json.loads(path.read_text(), parse_constant=_no_nan)


@pytest.fixture
def env():
    return dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                MPLBACKEND="Agg")


@pytest.fixture
def results():
    watcher = ResultCounter(DOMAIN)
    yield watcher
    watcher.close()


def _start_replay(source: Path, out: Path, env: dict, *extra: str) -> tuple[subprocess.Popen, int]:
    """``s2h replay`` in lock-step and the pid of the registration_node it started."""
    proc = subprocess.Popen([S2H, "replay", str(source), "--rate", "0", "--out", str(out), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # printed (flushed) as soon as the node is started
    match = re.search(r"started registration_node \(pid (\d+)\)", first)
    assert match, first + proc.stderr.read()
    return proc, int(match.group(1))


def _stop_leftover(pid: int) -> None:
    if process_running(pid):
        os.kill(pid, signal.SIGKILL)


def test_kill_9_of_s2h_replay_takes_its_node_with_it(curved_drive, tmp_path, env, results):
    replay, node_pid = _start_replay(curved_drive.folder, tmp_path / "out", env)
    try:
        assert results.wait_for(1, 120.0), "the node never answered a scan"
        assert process_running(node_pid)
        replay.kill()  # SIGKILL: no handler, no finally in s2h runs
        assert replay.wait(timeout=30) == -signal.SIGKILL
        assert poll_until(lambda: not process_running(node_pid), 15.0), "registration_node outlived s2h replay"
    finally:
        replay.kill()
        replay.communicate()
        _stop_leftover(node_pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_s2h_replay_writes_the_metrics_answered_so_far(curved_drive, tmp_path, env, results, sig):
    out = tmp_path / "out"
    replay, node_pid = _start_replay(curved_drive.folder, out, env)
    try:
        assert results.wait_for(2, 120.0), "the node never answered two scans"
        replay.send_signal(sig)
        stdout, stderr = replay.communicate(timeout=120)
    finally:
        replay.kill()
        _stop_leftover(node_pid)
    assert replay.returncode == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert f"s2h replay: stopped by {sig.name} after" in stderr, stderr
    report = _strict_json(out / "metrics.json")
    assert report["interrupted"] == sig.name
    assert 1 <= report["scans_answered"] <= report["scans_published"] < len(curved_drive), report
    assert report["scans_trusted"] >= 1 and "ate_rmse_m" in report["metrics"], report
    assert (out / "trajectory.png").stat().st_size > 1000
    assert "answered" in stdout and "trusted" in stdout  # the summary
    assert poll_until(lambda: not process_running(node_pid), 30.0), "s2h replay left its node running"


def test_sigint_to_kitti_replay_writes_the_metrics_answered_so_far(curved_drive, tmp_path, env, results):
    """What `ros2 launch` sends on Ctrl-C, to the executable of kitti_replay.launch.py."""
    node = subprocess.Popen(node_command([], []), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        replay = subprocess.Popen(
            [KITTI_REPLAY, "--ros-args", "--params-file", str(ROOT / "config" / "kitti.yaml"),
             "-p", f"sequence_dir:={curved_drive.folder}", "-p", "rate:=0", "-p", f"output_dir:={tmp_path}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert results.wait_for(2, 120.0), "the node never answered two scans"
            replay.send_signal(signal.SIGINT)
            stdout, stderr = replay.communicate(timeout=120)
        finally:
            replay.kill()
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=30)
    assert replay.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    report = _strict_json(tmp_path / "metrics.json")
    assert report["interrupted"] == "SIGINT" and report["scans_answered"] >= 1, report


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_s2h_eval_writes_the_partial_results(tmp_path, sig):
    jsonl, out_json, markdown = tmp_path / "pairs.jsonl", tmp_path / "eval.json", tmp_path / "eval.md"
    cmd = [S2H, "eval", "--dataset", "synthetic", "--n-pairs", "30", "--methods", "icp", "--no-progress",
           "--jsonl", str(jsonl), "--json", str(out_json), "--markdown", str(markdown)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert poll_until(lambda: jsonl.exists() and jsonl.read_text().count("\n") >= 1, 120.0), \
            "no pair record streamed"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert f"s2h eval: stopped by {sig.name}" in stderr, stderr
    result = _strict_json(out_json)
    assert result["interrupted"] == sig.name
    n = len(result["pairs"])
    assert 1 <= n < 30 and result["summary"]["icp"]["pairs"] == n, result["summary"]
    assert len(jsonl.read_text().splitlines()) == n  # every streamed record is in the JSON
    assert markdown.read_text() == result["table"] and f"| icp | {n} |" in result["table"]
    assert result["table"] in stdout


# ------------------------------------------------------------------ unwritable output folders


def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def _on_tmpfs(cmd: list[str], folder: Path, options: str) -> list[str]:
    """``cmd`` in a mount namespace of its own where ``folder`` is a tmpfs mounted with ``options``
    ("ro": read-only even for root, "size=4k": one page, full after one small file)."""
    folder.mkdir(parents=True, exist_ok=True)
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o {options} s2h_test "$0" && exec "$@"', str(folder), *cmd]


def _read_only(cmd: list[str], folder: Path) -> list[str]:
    if _can_mount():
        return _on_tmpfs(cmd, folder, "ro")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)  # enough where the tests do not run as root
    return cmd


def test_read_only_output_folders_fail_before_any_work_naming_them(curved_drive, tmp_path, env):
    ro = tmp_path / "ro"
    replay = subprocess.run(_read_only([S2H, "replay", str(curved_drive.folder), "--out", str(ro / "out")], ro),
                            env=env, capture_output=True, text=True, timeout=120)
    why = "Read-only file system" if _can_mount() else "Permission denied"
    assert replay.returncode == 2, replay.stdout + replay.stderr
    assert replay.stderr.splitlines() == [f"s2h replay: cannot write --out {ro / 'out'}: {why}"], replay.stderr
    assert "started registration_node" not in replay.stdout

    ev = subprocess.run(_read_only([S2H, "eval", "--dataset", "synthetic", "--n-pairs", "2", "--methods", "icp",
                                    "--json", str(ro / "eval.json")], ro), capture_output=True, text=True, timeout=120)
    assert ev.returncode == 2 and ev.stdout == "", ev.stdout + ev.stderr
    assert ev.stderr.splitlines() == [f"s2h eval: cannot write {ro}: {why}"], ev.stderr


@pytest.mark.skipif(not _can_mount(), reason="needs root and a mount namespace for a tiny tmpfs")
def test_a_full_output_folder_still_prints_the_results_and_names_the_file(curved_drive, tmp_path, env):
    full = tmp_path / "full"
    # The table and the Markdown fit in the one page; the JSON after it does not.
    ev = subprocess.run(_on_tmpfs([S2H, "eval", "--dataset", "synthetic", "--n-pairs", "2", "--methods", "icp",
                                   "--no-progress", "--markdown", str(full / "eval.md"),
                                   "--json", str(full / "eval.json")], full, "size=4k"),
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == 2, ev.stdout + ev.stderr
    assert "| icp | 2 |" in ev.stdout
    assert ev.stderr.splitlines() == [f"s2h eval: cannot write {full / 'eval.json'}: No space left on device"]

    # The replay's log fits, the plot does not: the summary still comes out.
    replay = subprocess.run(_on_tmpfs([S2H, "replay", str(curved_drive.folder), "--rate", "0", "--frames", "3",
                                       "--out", str(full)], full, "size=8k"),
                            env=env, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 2, replay.stdout + replay.stderr
    assert "3 scans published, 3 answered" in replay.stdout, replay.stdout
    assert f"s2h replay: cannot write {full / 'trajectory.png'}: No space left on device" in replay.stderr, \
        replay.stderr
    assert "Traceback" not in replay.stderr
