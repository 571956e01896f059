"""The client API either does what a script asks or says loudly that it did not.

Each test runs real scripts under the real supervisor (or the real client API), and each
failed on the code before the fix it covers: plain values dropped on restore, faults
that never fired in a ``run.log`` loop, a step lost to ``break``, checkpoint metrics of
the step before, an optimizer that pickles differently after a resume, a restore drill
that wrote into the working tree, the same exception retried blindly, an injected kill
described as an unexplained SIGKILL.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from acceptrun.errors import UserError

# ---- 1. restore gives back every plain value ---------------------------------------------------


def test_a_value_that_cannot_be_restored_is_named() -> None:
    from acceptrun.checkpoint.restore import restore_values

    hidden, history = torch.zeros(2, 3), [1]
    with pytest.raises(UserError, match=r"cannot restore 'hidden'.*shape \(4, 3\)"):
        restore_values(
            {"hidden": hidden, "history": history}, {"history": [], "hidden": torch.ones(4, 3)}
        )
    assert history == [1]  # checked before anything changed
    with pytest.raises(UserError, match=r"cannot restore 'counts': saved as a list"):
        restore_values({"counts": {}}, {"counts": [1, 2]})


# ---- 6. the same exception twice is not retried blindly; nccl on a CPU run is flagged ---------


def test_cpu_run_with_nccl_gets_a_preflight_warning(tmp_path: Path) -> None:
    from acceptrun.capture.preflight import check_backend
    from acceptrun.spec.model import load_spec

    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl")
            """
        )
    )
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        f'name = "t"\ncommand = ["{sys.executable}", "train.py"]\n'
        "[resources]\nprocesses = 2\ngpus = 0\n"
    )
    ok, message, details = check_backend(load_spec(spec_path))
    assert ok and details["warning"]
    assert "gloo" in message and "nccl" in message and "train.py" in message
    (tmp_path / "train.py").write_text(
        'import torch.distributed as dist\ndist.init_process_group("gloo")\n'
    )
    ok, message, details = check_backend(load_spec(spec_path))
    assert ok and not details.get("warning")
