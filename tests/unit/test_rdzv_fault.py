"""The injected rdzv fault: acceptrun's one-node torchrun command pointed at a loopback
c10d endpoint whose listener accepts and closes every connection, for one attempt only."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.load import parse_spec
from acceptrun.supervisor.faults import RDZV_READ_TIMEOUT_S, close_rendezvous, rendezvous_fault
from acceptrun.workload.contract import ENV_ATTEMPT, ENV_INJECT, ENV_RUN_ID
from acceptrun.workload.distributed import builds_torchrun, launch_command, with_rendezvous
from acceptrun.workload.inject import parse_faults, unfired


def _spec(command: str, processes: int = 2, nodes: int = 1) -> object:
    return parse_spec(
        f'name = "t"\ncommand = {command}\n[resources]\nprocesses = {processes}\nnodes = {nodes}\n'
    )


LIST = _spec('["python", "-u", "train.py", "--lr", "3e-4"]')


def test_the_fault_is_written_rdzv_at_an_attempt_and_reads_back() -> None:
    (fault,) = parse_faults("rdzv@attempt=2")
    assert (fault.action, fault.attempt, fault.step, fault.after_s) == ("rdzv", 2, None, None)
    assert str(fault) == "rdzv@attempt=2"
    for bad in ("rdzv@step=3", "rdzv@attempt=0", "rdzv@attempt=2:attempt=3", "kill@attempt=2"):
        with pytest.raises(UserError, match=re.escape(f"fault {bad!r}")):
            parse_faults(bad)
    fired = {"kind": "fault_injected", "attempt": 2, "action": "rdzv", "by": "supervisor"}
    assert unfired(["rdzv@attempt=2"], [fired]) == []
    assert unfired(["rdzv@attempt=2"], []) == [
        "rdzv@attempt=2 requested, the run never started attempt 2"
    ]


def test_only_the_torchrun_command_acceptrun_builds_for_one_node_can_be_pointed_elsewhere() -> None:
    assert builds_torchrun(LIST) is None
    assert builds_torchrun(_spec('"python train.py"')) is None
    assert "one process" in (builds_torchrun(_spec('["python", "t.py"]', processes=1)) or "")
    own = ('["torchrun", "--nproc-per-node", "2", "t.py"]',
           '["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"]')  # fmt: skip
    for command in own:
        assert "its own torchrun" in (builds_torchrun(_spec(command)) or ""), command
    assert "several nodes" in (builds_torchrun(_spec('["python", "t.py"]', nodes=2)) or "")


def test_the_rendezvous_replaces_standalone_in_a_list_and_in_a_shell_line() -> None:
    argv = launch_command(LIST)
    new = with_rendezvous(argv, "127.0.0.1:5", "r-a2", 3)
    assert "--standalone" not in new and new[-3:] == ["train.py", "--lr", "3e-4"]
    i = new.index("--rdzv-backend")
    assert new[i : i + 8] == ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:5",
                              "--rdzv-id", "r-a2", "--rdzv-conf", "read_timeout=3"]  # fmt: skip
    line = launch_command(_spec('"OMP_NUM_THREADS=1 python train.py"'))
    shell = with_rendezvous(line, "127.0.0.1:5", "r-a2", 3)
    assert shell[:2] == ["/bin/sh", "-c"] and "--standalone" not in shell[2]
    assert "--rdzv-endpoint 127.0.0.1:5" in shell[2] and shell[2].startswith("OMP_NUM_THREADS=1 ")
    with pytest.raises(ValueError, match="not acceptrun's torchrun command"):
        with_rendezvous(["torchrun", "--standalone", "t.py"], "127.0.0.1:5", "r", 3)


def _env(attempt: int, inject: str = "rdzv@attempt=2,kill@step=5:after=checkpoint") -> dict:
    return {ENV_INJECT: inject, ENV_ATTEMPT: str(attempt), ENV_RUN_ID: "r"}


def test_the_injected_attempt_meets_a_listener_that_closes_every_connection(
    tmp_path: Path,
) -> None:
    rec = RunRecord(tmp_path)
    argv = launch_command(LIST)
    assert rendezvous_fault(rec, LIST, _env(1), argv) == argv  # not this attempt's fault
    assert list(rec.events("fault_injected")) == []
    new = rendezvous_fault(rec, LIST, _env(2), argv)
    endpoint = new[new.index("--rdzv-endpoint") + 1]
    assert f"read_timeout={RDZV_READ_TIMEOUT_S}" in new
    host, port = endpoint.split(":")
    assert host == "127.0.0.1"
    for _ in range(3):  # each connection is accepted, then closed: no store protocol
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.settimeout(30)
            assert conn.recv(1) == b""
    (event,) = rec.events("fault_injected")
    assert (event["attempt"], event["action"], event["by"]) == (2, "rdzv", "supervisor")
    close_rendezvous(_env(2))  # the attempt ended
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=30).close()


def test_a_spec_whose_torchrun_is_its_own_keeps_its_command(tmp_path: Path) -> None:
    rec = RunRecord(tmp_path)
    own = _spec('["torchrun", "--nproc-per-node", "2", "t.py"]')
    argv = launch_command(own)
    assert rendezvous_fault(rec, own, _env(2), argv) == argv
    assert list(rec.events("fault_injected")) == []  # never fired: the verdict says so
