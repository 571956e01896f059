"""Failure classes of real child processes: real exit statuses, signals and stderr logs.

Each test runs a small script as a child process, reads its stderr log with
``stderr_tail`` and its events from ``events.jsonl``, and classifies the result the way
the supervisor does. CUDA failures cannot happen on a CPU machine: there the scripts
raise or print the exact messages torch and the CUDA runtime write.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.supervisor.classify import (
    CLASSES,
    AttemptFacts,
    Classification,
    classify,
    retry_allowed,
    stderr_tail,
)

PY = sys.executable
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (the [torch] extra)"
)

# Prepended to every script: events go to events.jsonl as the client writes them.
PRELUDE = """\
import json, os, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a SIGSEGV/SIGABRT test leaves no core
def event(kind, **fields):
    with open("events.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\\n")
"""

# The last lines of a real CUDA OOM on an H200 under torch.distributed (torch 2.x format).
REAL_CUDA_OOM = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has"
    " a total capacity of 139.81 GiB of which 1.88 MiB is free. Process 16653 has 612.00 MiB"
    " memory in use. Including non-PyTorch memory, this process has 139.20 GiB memory in use."
    " Of the allocated memory 2.05 GiB is allocated by PyTorch, and 136.64 GiB is reserved by"
    " PyTorch but unallocated. If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See"
    " documentation for Memory Management "
    " (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
# torch >= 2.8 raises torch.AcceleratorError with this message; the match is line 1 of 5.
ILLEGAL_ADDRESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the"
    " stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


class Attempt:
    """A child process run to its end, with what the supervisor would know about it."""

    def __init__(self, tmp_path: Path, argv: Sequence[str], timeout: float = 300) -> None:
        # ``timeout`` only guards against a hang: a child importing torch on a busy
        # machine takes far longer than the 3 s it takes on a quiet one.
        self.dir = tmp_path
        with open(tmp_path / "stderr.log", "wb") as err:
            proc = subprocess.run(
                argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, timeout=timeout
            )
        self.returncode = proc.returncode
        self.stderr = stderr_tail(tmp_path / "stderr.log")
        self.events = list(read_jsonl(tmp_path / "events.jsonl"))

    def facts(self, **overrides: Any) -> AttemptFacts:
        """AttemptFacts as the supervisor builds them: a signal name instead of -N."""
        rc = self.returncode
        fields: dict[str, Any] = {
            "returncode": rc if rc >= 0 else None,
            "signal": signal.Signals(-rc).name if rc < 0 else None,
            "stop_cause": None,
            "stderr_tail": self.stderr,
            "events": self.events,
        }
        return AttemptFacts(**(fields | overrides))

    def classify(self, **overrides: Any) -> Classification:
        result = classify(self.facts(**overrides))
        assert result.name in CLASSES
        assert 0 < len(result.evidence) <= 5 and all(len(e) <= 300 for e in result.evidence)
        assert result.reason
        return result

    def stderr_line(self, startswith: str) -> str:
        """The real stderr line that starts with ``startswith`` (the evidence to expect)."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip().startswith(startswith)]
        assert lines, f"no stderr line starts with {startswith!r}:\n{self.stderr}"
        return lines[-1]


def script(tmp_path: Path, source: str, *args: str, name: str = "work.py") -> Attempt:
    (tmp_path / name).write_text(PRELUDE + textwrap.dedent(source))
    return Attempt(tmp_path, [PY, name, *args])


# ---- the workload ended on its own --------------------------------------------------------


def test_exit_0_is_success(tmp_path: Path) -> None:
    c = script(tmp_path, "print('done')").classify()
    assert (c.name, c.retry, c.evidence) == ("success", False, ["exit status 0"])


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT"])
def test_a_signal_without_other_evidence_is_killed(tmp_path: Path, sig: str) -> None:
    attempt = script(tmp_path, f"os.kill(os.getpid(), signal.{sig})")
    assert attempt.returncode == -signal.Signals[sig]
    c = attempt.classify(oom_kills=0)
    assert (c.name, c.retry, c.evidence) == ("killed", True, [f"killed by {sig}"])


def test_sigterm_the_supervisor_did_not_send_is_preempted(tmp_path: Path) -> None:
    attempt = script(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)")
    c = attempt.classify()
    assert attempt.facts().signal == "SIGTERM"
    assert (c.name, c.retry, c.evidence) == ("preempted", True, ["killed by SIGTERM"])


def test_exit_143_and_a_stopped_event_are_preempted(tmp_path: Path) -> None:
    c = script(tmp_path, "print('saving', file=sys.stderr); sys.exit(143)").classify()
    assert (c.name, c.retry, c.evidence) == ("preempted", True, ["exit status 143"])
    # The client's way: a "stopped" event after its SIGTERM handler saved a checkpoint.
    attempt = script(tmp_path, "event('stopped', step=5, checkpoint=4); sys.exit(143)")
    c = attempt.classify()
    assert c.name == "preempted" and '"kind": "stopped"' in c.evidence[0]


def test_memory_error_is_host_oom(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vm + 200 * 2**20, resource.RLIM_INFINITY))
        block = bytearray(2**30)  # 1 GiB past a 200 MB allowance: a real MemoryError
        """,
    )
    c = attempt.classify()
    assert (c.name, c.retry) == ("host_oom", True)
    assert c.evidence == [attempt.stderr_line("MemoryError"), "exit status 1"]


@pytest.mark.parametrize(
    ("source", "line"),
    [
        pytest.param(  # /dev/full answers every write with ENOSPC, as a full disk does
            "open('/dev/full', 'wb', buffering=0).write(b'x')", "OSError: [Errno 28]", id="enospc"
        ),
        pytest.param(  # a file-size limit: EFBIG, as test_storage_faults.py makes a full disk
            """
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
            open('big.bin', 'wb', buffering=0).write(b'x' * 8192)
            open('big.bin', 'ab', buffering=0).write(b'x')
            """,
            "OSError: [Errno 27]",
            id="efbig",
        ),
    ],
)
def test_a_full_disk_is_disk_full_and_not_retried(tmp_path: Path, source: str, line: str) -> None:
    attempt = script(tmp_path, source)
    c = attempt.classify()
    assert (c.name, c.retry) == ("disk_full", False)
    assert c.evidence == [attempt.stderr_line(line), "exit status 1"]
    assert "acceptrun resume" in c.reason


def test_sigkill_with_a_counted_oom_kill_is_host_oom(tmp_path: Path) -> None:
    c = script(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)").classify(oom_kills=1)
    assert (c.name, c.retry) == ("host_oom", True)
    assert "killed by SIGKILL" in c.evidence and "OOM kill" in c.reason


def test_a_shell_reporting_a_killed_child_is_host_oom_or_killed(tmp_path: Path) -> None:
    # The shell forks (it has more to do), reports "Killed" and exits 128 + 9.
    body = '"$0" -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"; exit $?'
    attempt = Attempt(tmp_path, ["sh", "-c", body, PY])
    assert attempt.returncode == 137
    c = attempt.classify(oom_kills=1)
    assert (c.name, c.retry) == ("host_oom", True)
    assert "Killed" in c.evidence[0] and c.evidence[0] in attempt.stderr
    c = attempt.classify(oom_kills=0)
    assert (c.name, c.retry, c.evidence) == ("killed", True, ["exit status 137"])
    assert "SIGKILL" in c.reason


@needs_torch
def test_torch_cpu_allocation_failure_is_host_oom(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        import torch
        vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vm + 200 * 2**20, resource.RLIM_INFINITY))
        torch.empty(2**30, dtype=torch.uint8)
        """,
    )
    c = attempt.classify()
    assert c.name == "host_oom"
    assert c.evidence[0] == attempt.stderr_line("RuntimeError: [enforce fail at alloc_cpu")


@needs_torch
def test_cuda_out_of_memory_is_cuda_oom_with_one_retry(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        import torch
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        """,
    )
    c = attempt.classify()
    assert (c.name, c.retry) == ("cuda_oom", True)
    assert c.evidence == [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "exit status 1",
    ]
    assert "one retry" in c.reason
    assert retry_allowed("cuda_oom", 0) and not retry_allowed("cuda_oom", 1)


def test_a_real_cuda_oom_message_decides_over_earlier_warnings(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        f"""
        print("/opt/venv/lib/python3.11/site-packages/apex/__init__.py:7: UserWarning:"
              " ImportError: fused kernels not found", file=sys.stderr)
        print("[rank0]: Traceback (most recent call last):", file=sys.stderr)
        print('[rank0]:   File "/srv/train.py", line 88, in <module>', file=sys.stderr)
        print("[rank0]:     loss = model(batch).loss", file=sys.stderr)
        print({REAL_CUDA_OOM!r}, file=sys.stderr)
        sys.exit(1)
        """,
    )
    c = attempt.classify()
    assert c.name == "cuda_oom"
    assert c.evidence == [REAL_CUDA_OOM[:297] + "...", "exit status 1"]


_USER_ERRORS = {
    "module": ("import no_such_module_xyz\n", "ModuleNotFoundError: No module named"),
    "syntax": ("def broken(:\n    pass\n", "SyntaxError:"),
    "syntax-import": ("with open('bad.py', 'w') as f: f.write('x = (')\nimport bad\n", "SyntaxError:"),
    "file": ("open('/no/such/data/train.bin')\n", "FileNotFoundError: [Errno 2]"),
    "name": ("total = undefined_name + 1\n", "NameError: name 'undefined_name'"),
    "argparse": (
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--lr', type=float, required=True)\np.parse_args()\n",
        "work.py: error: the following arguments are required: --lr",
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(_USER_ERRORS))
def test_start_up_errors_are_user_errors(tmp_path: Path, kind: str) -> None:
    source, expected = _USER_ERRORS[kind]
    if kind == "syntax":
        (tmp_path / "work.py").write_text(source)  # no prelude: the file itself is broken
        attempt = Attempt(tmp_path, [PY, "work.py"])
    else:
        attempt = script(tmp_path, source)
    assert attempt.returncode == (2 if kind == "argparse" else 1)
    c = attempt.classify()
    assert (c.name, c.retry) == ("user_error", False), c
    assert c.evidence[0] == attempt.stderr_line(expected)


def test_missing_script_and_missing_command_are_user_errors(tmp_path: Path) -> None:
    attempt = Attempt(tmp_path, [PY, "no_such_script.py"])
    c = attempt.classify()
    assert (attempt.returncode, c.name, c.retry) == (2, "user_error", False)
    assert "can't open file" in c.evidence[0]
    attempt = Attempt(tmp_path, ["sh", "-c", "no-such-command-xyz"])
    c = attempt.classify()
    assert (attempt.returncode, c.name, c.retry) == (127, "user_error", False)
    assert c.evidence[0] == attempt.stderr.strip().splitlines()[-1]
    assert "no-such-command-xyz" in c.evidence[0]


def test_a_missing_file_after_the_first_step_is_failed_and_retried(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        for step in range(1, 4):
            event("step", step=step, loss=1.0 / step)
        open("/mnt/flaky/shard-00042.bin")
        """,
    )
    c = attempt.classify()
    assert (c.name, c.retry) == ("failed", True)
    assert c.evidence[0] == attempt.stderr_line("FileNotFoundError:")
    assert c.evidence[1].startswith("last step event: step 3 at ")


def test_warnings_before_an_ordinary_exception_do_not_count(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        print("[rank0]:[W1218 20:27:21.426 ProcessGroupNCCL.cpp:1250] Warning: WARNING:"
              " process group has NOT been destroyed", file=sys.stderr)
        print("train.py:3: UserWarning: ImportError: flash-attn is missing", file=sys.stderr)
        print("CUDA out of memory on the first try; retrying with batch 16", file=sys.stderr)
        raise ValueError("learning rate must be positive, got -0.1")
        """,
    )
    c = attempt.classify()
    assert (c.name, c.retry) == ("failed", True)
    assert c.evidence == [
        "ValueError: learning rate must be positive, got -0.1",
        "exit status 1",
    ]


def test_xid_errors_and_cuda_faults_are_gpu_faults(tmp_path: Path) -> None:
    attempt = script(tmp_path, "raise RuntimeError('step 812 failed')")
    c = attempt.classify(xid_errors=["Xid 79 on GPU 0"])
    assert (c.name, c.retry) == ("gpu_fault", True)
    assert c.evidence[0] == "Xid 79 on GPU 0"
    # The matching line is the exception's first line, not the traceback's last one.
    attempt = script(tmp_path, f"raise RuntimeError({ILLEGAL_ADDRESS!r})")
    c = attempt.classify()
    assert c.name == "gpu_fault"
    assert c.evidence[0] == attempt.stderr_line("RuntimeError: CUDA error: an illegal memory")
    # A CUDA error in a C++ thread aborts the process: no Python traceback, every line counts.
    attempt = script(
        tmp_path,
        """
        sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\\n"
                         "  what():  CUDA error: an illegal memory access was encountered\\n"
                         "frame #0: c10::Error::Error(...) + 0x96 (0x7f0 in libc10.so)\\n")
        sys.stderr.flush()
        os.abort()
        """,
    )
    c = attempt.classify()
    assert (attempt.facts().signal, c.name) == ("SIGABRT", "gpu_fault")
    assert c.evidence == [attempt.stderr_line("what():"), "killed by SIGABRT"]


@needs_torch
def test_a_rank_that_loses_its_peer_is_distributed(tmp_path: Path) -> None:
    rank = textwrap.dedent(
        f"""
        import os, sys
        from datetime import timedelta
        import torch, torch.distributed as dist
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=rank,
                                world_size=2, timeout=timedelta(seconds=300))
        t = torch.ones(4)
        dist.all_reduce(t)
        if rank == 1:
            os._exit(0)  # leaves the group early: rank 0's next collective has no peer
        dist.all_reduce(t)
        """
    )
    (tmp_path / "rank.py").write_text(rank)
    procs = []
    for r in (0, 1):
        with open(tmp_path / f"stderr-{r}.log", "wb") as err:
            procs.append(subprocess.Popen([PY, "rank.py", str(r)], cwd=tmp_path, stderr=err))
    codes = [p.wait(timeout=300) for p in procs]  # a hang guard; torch's import is slow
    assert codes == [1, 0], (tmp_path / "stderr-0.log").read_text()
    facts = AttemptFacts(1, None, None, stderr_tail(tmp_path / "stderr-0.log"), [])
    c = classify(facts)
    assert (c.name, c.retry) == ("distributed", True)
    # The real line, cut to 300 characters: "[rank0]: RuntimeError: [.../gloo/.../pair.cc:...]"
    assert c.evidence[0].removesuffix("...") in facts.stderr_tail and "gloo" in c.evidence[0]
    assert c.evidence[0].startswith("[rank0]: RuntimeError:")


@needs_torch
def test_torchrun_failures_are_classified_by_the_child(tmp_path: Path) -> None:
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    (tmp_path / "child.py").write_text("import no_such_module_xyz\n")
    attempt = Attempt(tmp_path, [*torchrun, "child.py"], timeout=300)
    assert "ChildFailedError" in attempt.stderr
    c = attempt.classify()
    assert (c.name, c.retry) == ("user_error", False)
    assert c.evidence[0] == attempt.stderr_line("ModuleNotFoundError:")
    # Without the child's own traceback, torchrun's ChildFailedError is all there is.
    (tmp_path / "child.py").write_text("import os\nos._exit(3)\n")
    attempt = Attempt(tmp_path, [*torchrun, "child.py"], timeout=300)
    c = attempt.classify()
    assert (c.name, c.retry) == ("distributed", True)
    assert c.evidence[0] == attempt.stderr_line("torch.distributed.elastic.multiprocessing.errors")


def test_a_diverged_event_is_diverged_without_retry(tmp_path: Path) -> None:
    attempt = script(
        tmp_path,
        """
        event("step", step=119, loss=2.5)
        event("diverged", step=120, loss="nan", reason="loss is NaN")
        sys.exit(1)
        """,
    )
    c = attempt.classify()
    assert (c.name, c.retry) == ("diverged", False)
    assert '"kind": "diverged"' in c.evidence[0] and "step 120" in c.reason


# ---- the supervisor ended the attempt -----------------------------------------------------


@pytest.mark.parametrize(
    ("cause", "name", "retry"),
    [
        ("wall_time", "wall_time", False),
        ("budget", "budget", False),
        ("idle", "idle", False),
        ("user", "stopped", False),
        ("hang", "hang", True),
        ("data_stall", "data_stall", True),
    ],
)
def test_stop_causes_decide_before_the_exit(
    tmp_path: Path, cause: str, name: str, retry: bool
) -> None:
    # The same SIGTERM death is a preemption when the supervisor did not send it.
    attempt = script(tmp_path, "event('step', step=7); os.kill(os.getpid(), signal.SIGTERM)")
    assert attempt.classify().name == "preempted"
    c = attempt.classify(stop_cause=cause)
    assert (c.name, c.retry) == (name, retry)
    assert c.evidence[:1] == [f"stop cause: {cause}"]
    if cause in ("hang", "data_stall"):
        assert c.evidence[1].startswith("last step event: step 7 at ")
