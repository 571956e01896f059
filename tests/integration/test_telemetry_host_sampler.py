"""The host sampler in real runs: a supervised run writes telemetry.jsonl by the contract
with the GPU absent, the whole process tree is measured, gpu = false is kept, a zombie is
not counted (the samplers' faults and NVML fields: tests/unit/test_telemetry_sampler.py)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from acceptrun.spec.model import parse_spec
from acceptrun.telemetry.sampler import HostSampler, RunTelemetry
from conftest import wait_for

HOST_KEYS = {
    "t", "kind", "attempt", "cpu_pct", "load1", "mem_used", "mem_total", "proc_cpu_pct",
    "proc_rss", "proc_count", "disk_read_bps", "disk_write_bps", "net_recv_bps",
    "net_sent_bps", "free_run_dir", "free_ckpt_dir",
}  # fmt: skip

# The spin is bracketed by two samples, however late a busy machine starts the sampler or
# runs its ticks: the workload waits on FIFOs that the test opens once a sample was taken
# before the spin, and once one was taken after it (while the workload still lives).
LOOP = """
import time, acceptrun
run = acceptrun.init()
with open("start") as f:  # a FIFO: blocks until the test opens it
    f.read()
for step in run.steps(25):
    t = time.process_time()
    while time.process_time() - t < 0.04:  # 40 ms of CPU, however long a busy machine takes
        pass
    run.log(step, loss=1.0 / (step + 1), samples=8)
open("spun", "w").close()
with open("end") as f:
    f.read()
"""


def host_samples(ws: Path) -> int:
    """Host samples in the workspace's one run so far (a line being written not counted)."""
    count = 0
    for path in ws.glob("runs/*/telemetry.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                count += json.loads(line).get("kind") == "host"
    return count


def release(fifo: Path) -> bool:
    """Open ``fifo`` for writing if its reader is waiting (then it goes on); else False."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nobody reads it yet
            return False
        raise
    return True


def bracket(tmp_path: Path, out: dict[str, Any]) -> None:
    """The test's side of LOOP (a thread): the indices of the samples around the spin."""
    ws = tmp_path / "ws"
    try:
        wait_for(lambda: host_samples(ws) >= 1, what="a host sample before the spin")
        out["first"] = host_samples(ws) - 1
        wait_for(lambda: release(tmp_path / "start"), what="the workload at its start")
        wait_for((tmp_path / "spun").exists, what="the end of the spin")
        seen = host_samples(ws)
        wait_for(lambda: host_samples(ws) > seen, what="a host sample after the spin")
        out["last"] = seen
        wait_for(lambda: release(tmp_path / "end"), what="the workload at its end")
    except BaseException as exc:  # pytest.fail raises outside Exception: kept for the test
        out["error"] = exc
        for fifo in ("start", "end"):  # never leave the workload blocked
            with contextlib.suppress(OSError):
                release(tmp_path / fifo)


def telemetry(record: RunRecord) -> list[dict[str, Any]]:
    return list(read_jsonl(record.telemetry_path))


@pytest.mark.slow
def test_supervised_run_writes_host_samples_and_gpu_absent(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(textwrap.dedent(LOOP))
    (tmp_path / "spec.toml").write_text(
        f'name = "tel"\ncommand = ["{sys.executable}", "work.py"]\n[telemetry]\ninterval = "0.2s"\n'
    )
    for fifo in ("start", "end"):
        os.mkfifo(tmp_path / fifo)
    found: dict[str, Any] = {}
    side = threading.Thread(target=bracket, args=(tmp_path, found), daemon=True)
    side.start()
    result = launch(tmp_path / "spec.toml", workspace=tmp_path / "ws", echo=False)
    side.join()
    if "error" in found:
        raise found["error"]
    assert result.exit_code == 0, result.verdict
    lines = telemetry(result.record)
    absent = [x for x in lines if x["kind"] == "gpu_absent"]
    assert len(absent) == 1 and absent[0]["reason"]  # this machine has no NVIDIA GPU
    hosts = [x for x in lines if x["kind"] == "host"]
    assert len(hosts) >= 2, lines
    for h in hosts:
        assert set(h) == HOST_KEYS
        assert h["attempt"] == 1
        assert 0 < h["mem_used"] <= h["mem_total"]
        assert h["free_run_dir"] > 0 and h["free_ckpt_dir"] > 0
    # While the workload runs, its tree is measured (a tick just after its exit sees none).
    alive = [h for h in hosts if h["proc_count"] >= 1]
    assert len(alive) >= 2 and all(h["proc_rss"] > 0 for h in alive)  # the bracket, at least
    # The loop spins 1 s of CPU between two samples it waited for: the samples between them
    # add up to at least most of it, whatever share of a busy machine it got.
    spun = hosts[found["first"] : found["last"] + 1]
    cpu_s = sum(b["proc_cpu_pct"] * (b["t"] - a["t"]) / 100 for a, b in itertools.pairwise(spun))
    assert cpu_s > 0.8, (found, hosts)
    assert [x["t"] for x in hosts] == sorted(x["t"] for x in hosts)
    assert not [x for x in lines if x["kind"] == "sampler_error"]


def test_host_sampler_measures_the_whole_process_tree(tmp_path: Path) -> None:
    # A parent that sleeps and a grandchild that spins: the tree's CPU is the grandchild's.
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        host = HostSampler(proc.pid, tmp_path, tmp_path / "missing" / "ckpt")
        wait_for(lambda: len(_children(proc.pid)) == 1, what="the spinning grandchild")
        (spinner,) = _children(proc.pid)
        t0 = time.monotonic()
        first = host.sample()
        start = sum(spinner.cpu_times()[:2])  # user + system seconds
        # Half a second of the grandchild's CPU, however long a busy machine takes to give it.
        wait_for(lambda: sum(spinner.cpu_times()[:2]) - start > 0.5, what="0.5 s of its CPU")
        spun = sum(spinner.cpu_times()[:2]) - start
        second = host.sample()
        dt = time.monotonic() - t0  # at least the sampler's own interval
    finally:
        for child in _children(proc.pid):
            child.kill()
        proc.kill()
        proc.wait()
    assert first["proc_count"] == 2 and second["proc_count"] == 2
    assert second["proc_rss"] > first["proc_rss"] / 2 > 0
    # The tree's CPU is the grandchild's (the parent sleeps): at least what it spun meanwhile.
    assert second["proc_cpu_pct"] / 100 * dt >= 0.95 * spun > 0
    assert len(host.pids) == 2 and proc.pid in host.pids
    assert second["free_ckpt_dir"] == second["free_run_dir"] or second["free_ckpt_dir"] > 0


def _children(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def test_run_telemetry_respects_gpu_false_and_joins_its_thread(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    spec = parse_spec(
        'name = "x"\ncommand = ["true"]\n[telemetry]\ninterval = "0.05s"\ngpu = false\n'
    )
    tel = RunTelemetry(record, spec)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tel.begin(1, proc.pid, None, tmp_path / "ckpt")
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline
            and sum(1 for x in telemetry(record) if x["kind"] == "host") < 2
        ):
            time.sleep(0.05)
        thread = tel.thread
        tel.close()
    finally:
        proc.kill()
        proc.wait()
    assert thread is not None and not thread.is_alive()
    lines = telemetry(record)
    assert lines[0] == {"t": lines[0]["t"], "kind": "gpu_absent", "reason": "telemetry.gpu = false"}
    assert next(x for x in lines if x["kind"] == "host")["proc_count"] == 1


def test_a_zombie_is_not_counted_as_a_live_process(tmp_path: Path) -> None:
    """The workload has exited but its parent has not reaped it yet (the moment between an
    attempt's exit and the supervisor's wait): a sample then sees no process, not one of
    0 bytes (the supervised-run test above once saw proc_count 1 with proc_rss 0)."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(
            lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
            what="the child to exit (it is not reaped until wait())",
        )
        sample = HostSampler(child.pid, tmp_path, tmp_path).sample()
        assert (sample["proc_count"], sample["proc_rss"]) == (0, 0), sample
    finally:
        child.wait()
