"""Errors of the public API are AcceptrunError and still the built-in type they were.

A training script may catch ``acceptrun.AcceptrunError`` for anything acceptrun refused,
or keep the ``except ValueError`` it had: both must work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import acceptrun
from acceptrun import errors
from acceptrun.checkpoint.staging import stage
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import Workspace
from acceptrun.run import standalone as run_module
from acceptrun.spec.model import load_spec
from acceptrun.workload.run import Run


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        pytest.param(errors.AcceptrunValueError, ValueError, id="value"),
        pytest.param(errors.AcceptrunTypeError, TypeError, id="type"),
        pytest.param(errors.AcceptrunKeyError, KeyError, id="key"),
        pytest.param(errors.AcceptrunFileNotFoundError, FileNotFoundError, id="file-not-found"),
        pytest.param(errors.AcceptrunRuntimeError, RuntimeError, id="runtime"),
    ],
)
def test_each_compatible_error_is_both(cls: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(cls, errors.AcceptrunError)
    assert issubclass(cls, builtin)
    assert cls.__name__ in errors.__all__


def test_a_key_error_reads_as_written_not_as_a_repr() -> None:
    assert str(errors.AcceptrunKeyError("'epoch' is not registered")) == (
        "'epoch' is not registered"
    )


def test_a_full_checkpoint_disk_is_still_the_os_error_it_was() -> None:
    from acceptrun.checkpoint.saver import CheckpointDiskFullError, CheckpointError

    exc = CheckpointDiskFullError("ck is full: ...", errno=28, directory="ck", needed=9, free=1)
    # except OSError / CheckpointError / UserError / AcceptrunError in a script: all catch it
    for base in (OSError, CheckpointError, errors.DiskFullError, errors.UserError):
        assert isinstance(exc, base), base
    assert (exc.errno, exc.filename, exc.needed, exc.free) == (28, "ck", 9, 1)
    assert str(exc) == "ck is full: ..."  # the message, not OSError's "[Errno 28] ..."
    assert "DiskFullError" in errors.__all__


def test_a_full_disk_error_survives_pickle_between_processes() -> None:
    # DCP gathers a failed rank's exception with pickle; keyword-only arguments broke that.
    import pickle

    from acceptrun.checkpoint.saver import CheckpointDiskFullError

    exc = CheckpointDiskFullError("ck is full: ...", errno=28, directory="ck", needed=9, free=1)
    exc.intact = 4
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is CheckpointDiskFullError and str(back) == "ck is full: ..."
    assert (back.errno, back.directory, back.needed, back.free, back.intact) == (28, "ck", 9, 1, 4)
    plain = pickle.loads(pickle.dumps(errors.DiskFullError("full", errno=27, directory="d")))
    assert type(plain) is errors.DiskFullError and (plain.errno, plain.filename) == (27, "d")


def test_git_error_is_a_user_error_the_cli_exits_2_on() -> None:
    assert issubclass(errors.GitError, errors.UserError)
    assert errors.GitError.exit_code == 2


def _caught(call: object, builtin: type[Exception]) -> Exception:
    """Run ``call`` and return what it raised, checking both ways of catching it."""
    assert callable(call)
    with pytest.raises(builtin) as info:
        call()
    assert isinstance(info.value, errors.AcceptrunError), type(info.value).__mro__
    return info.value


# ---- acceptrun.init ------------------------------------------------------------------------


def test_init_with_a_run_dir_that_is_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "_active", None)
    monkeypatch.setenv("ACCEPTRUN_RUN_DIR", str(tmp_path / "nothing-here"))
    exc = _caught(acceptrun.init, RuntimeError)
    assert "which is not a run record" in str(exc)


def test_init_under_torchrun_without_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "_active", None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    exc = _caught(acceptrun.init, RuntimeError)
    assert "start it with `acceptrun run spec.toml`" in str(exc)


# ---- Run methods ---------------------------------------------------------------------------


@pytest.fixture
def run(tmp_path: Path) -> Run:
    ws = Workspace.create(tmp_path / ".acceptrun")
    record = ws.create_run(
        "errors",
        spec_text='name = "errors"\ncommand = ["python", "train.py"]\n',
        state={"mode": "standalone", "status": "running", "attempts": 1},
    )
    return Run(record, attempt=1, supervised=False)


def test_run_metric_without_a_name(run: Run) -> None:
    exc = _caught(lambda: run.metric("", 1.0), ValueError)
    assert "metric name is empty" in str(exc)


def test_run_output_of_a_missing_file(run: Run, tmp_path: Path) -> None:
    exc = _caught(lambda: run.output("model", tmp_path / "model.pt"), FileNotFoundError)
    assert "write it before run.output()" in str(exc)


def test_run_state_of_a_name_never_registered(run: Run) -> None:
    exc = _caught(lambda: run.state("epoch"), KeyError)
    assert str(exc).startswith("'epoch' is not registered")


def test_run_checkpoint_with_nothing_registered(run: Run) -> None:
    exc = _caught(lambda: run.checkpoint(1), RuntimeError)
    assert "call run.restore(model=..., optimizer=...) first" in str(exc)


# ---- the checkpoint API --------------------------------------------------------------------


def _sampler() -> Any:
    pytest.importorskip("torch", reason="ResumableSampler is a torch Sampler")
    from acceptrun.checkpoint.loader import ResumableSampler

    return ResumableSampler


def test_resumable_sampler_of_negative_length() -> None:
    ResumableSampler = _sampler()
    exc = _caught(lambda: ResumableSampler(-1), ValueError)
    assert "pass a dataset or a size" in str(exc)


def test_resumable_sampler_epoch_start_out_of_range() -> None:
    sampler = _sampler()(4)
    _caught(lambda: sampler.set_epoch(0, start=9), ValueError)


def test_checkpoint_store_keep_last_zero(tmp_path: Path) -> None:
    exc = _caught(lambda: CheckpointStore(tmp_path / "ckpt", keep_last=0), ValueError)
    assert "keep_last must be an integer >= 1" in str(exc)


def test_a_state_that_cannot_be_saved_without_pickle() -> None:
    exc = _caught(lambda: stage({"hook": {"fn": lambda: None}}, rng=False), TypeError)
    assert "hook/fn" in str(exc)


def test_an_object_name_with_a_slash() -> None:
    _caught(lambda: stage({"a/b": 1}, rng=False), ValueError)


# ---- load_spec -----------------------------------------------------------------------------


def test_load_spec_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(errors.SpecError, match="file not found; create one with `acceptrun init`"):
        load_spec(tmp_path / "spec.toml")


# ---- integrations --------------------------------------------------------------------------


def test_accelerate_track_before_prepare() -> None:
    accelerate = pytest.importorskip("accelerate")
    from acceptrun.integrations.accelerate import track

    accelerator = accelerate.Accelerator(cpu=True)
    with pytest.raises(errors.AcceptrunError, match=r"came before accelerator\.prepare"):
        track(accelerator)
