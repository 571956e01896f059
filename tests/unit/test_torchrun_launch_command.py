"""torchrun without a run: the launch command, what it cannot start, rank variables, scaling
efficiency, a store committing files another rank wrote (real ranks:
tests/integration/test_torchrun.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.errors import SpecError, UserError
from acceptrun.spec.model import parse_spec
from acceptrun.tune.scaling import (
    ScalingPoint,
    format_scaling,
    parse_counts,
    with_efficiency,
)
from acceptrun.workload.distributed import launch_command, rank_info

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
WRAP = [*TORCHRUN, "--nproc-per-node", "2", "--max-restarts", "0"]


def spec_of(command: str, processes: int = 2, grace: str = "30s") -> Any:
    text = f'name = "t"\ncommand = {command}\n[resources]\nprocesses = {processes}\n'
    text += f'[limits]\ngrace_period = "{grace}"\n'
    return parse_spec(text, source="spec.toml")


# ---- the launch command (no process) --------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param(
            '["python", "train.py", "--lr", "1"]',
            ["python", *WRAP, "train.py", "--lr", "1"],
            id="list",
        ),
        pytest.param(
            '["/venv/bin/python3", "-u", "-m", "pkg.train", "x"]',
            ["/venv/bin/python3", "-u", *WRAP, "--module", "pkg.train", "x"],
            id="module",
        ),
        pytest.param(
            '["torchrun", "--nproc-per-node=2", "train.py"]',
            ["torchrun", "--nproc-per-node=2", "train.py"],
            id="torchrun-kept",
        ),
        pytest.param(
            '["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"]',
            ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"],
            id="module-torchrun-kept",
        ),
        pytest.param(
            "\"SEED='a b' python train.py --x 'y z'\"",
            ["/bin/sh", "-c", "SEED='a b' python " + " ".join(WRAP) + " train.py --x 'y z'"],
            id="string",
        ),
    ],
)
def test_launch_command_wraps_python_in_torchrun(command: str, expected: list[str]) -> None:
    env: dict[str, str] = {}
    assert launch_command(spec_of(command, grace="45s"), env) == expected
    assert env["PET_SHUTDOWN_TIMEOUT"] == "45"  # torchrun waits the grace period for ranks
    assert "SIGUSR2" in env["PET_SIGNALS_TO_HANDLE"]  # forwarded for stack dumps
    one = spec_of(command, processes=1)
    assert launch_command(one, {}) == one.command  # one process: the command as written


@pytest.mark.parametrize(
    ("command", "why"),
    [
        pytest.param('["bash", "train.sh"]', "'bash' is not a Python interpreter", id="bash"),
        pytest.param('["python", "-O", "train.py"]', "interpreter option '-O'", id="flag"),
        pytest.param('"cd src && python train.py"', "a shell list", id="shell-list"),
        pytest.param('["torchrun", "--nproc-per-node", "4", "t.py"]', "starts 4", id="nproc"),
    ],
)
def test_launch_command_refuses_what_torchrun_cannot_start(command: str, why: str) -> None:
    with pytest.raises(SpecError, match=r"resources\.processes = 2") as err:
        launch_command(spec_of(command))
    assert why in str(err.value)


def test_rank_info_reads_torchrun_variables() -> None:
    assert rank_info({}) == rank_info({"WORLD_SIZE": "1"})
    info = rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.distributed) == (3, 4, 1, True)
    with pytest.raises(RuntimeError, match="RANK=4 is not a rank of WORLD_SIZE=4"):
        rank_info({"RANK": "4", "WORLD_SIZE": "4"})


def test_scaling_efficiency_against_the_smallest_count() -> None:
    assert parse_counts("2, 1,4,2") == [1, 2, 4]
    with pytest.raises(UserError, match="'0' is not a process count"):
        parse_counts("1,0")
    points = with_efficiency(
        [
            ScalingPoint(1, "r1", "accepted", 50, 1000.0, "samples/s"),
            ScalingPoint(2, "r2", "accepted", 50, 1500.0, "samples/s"),
            ScalingPoint(4, "r4", "rejected; no timed step events", 0, None, "steps/s"),
        ]
    )
    assert [p.efficiency for p in points] == [1.0, 0.75, None]
    table = format_scaling(points).splitlines()
    assert table[0].split() == ["processes", "throughput", "efficiency", "steps", "run", "verdict"]
    assert table[2].split()[:5] == ["2", "1500", "samples/s", "0.75", "50"]
    assert table[3].split()[:3] == ["4", "-", "-"]


def test_store_commits_files_another_rank_wrote_into_the_save(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    owner = store.begin(7)
    owner.write_bytes("state.json", b"{}")
    joined = store.join(7, owner.path)  # what rank 1 does with the path rank 0 broadcast
    joined.write_bytes("rank-1/state.json", b'{"rank": 1}')
    with pytest.raises(UserError, match="begun by another store"):
        store.commit(joined)  # only the owner commits
    store.abort(joined)  # a rank's failure leaves the save to the owner
    assert owner.path.is_dir()
    with pytest.raises(UserError, match="not a staging directory"):
        store.join(8, owner.path)
    owner.adopt(*joined.written())
    info = store.commit(owner)
    assert set(info.files) == {"state.json", "rank-1/state.json"}
    assert store.verify(7).ok
    (info.path / "rank-1" / "state.json").write_bytes(b'{"rank": 2}')
    assert "rank-1/state.json: wrong hash" in store.verify(7).problems[0]
