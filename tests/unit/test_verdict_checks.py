"""Every verdict check on records written file by file: a pass, a fail, not recorded.

No process, no sleep: each record is what the supervisor and the client would have left
(tests/unit/verdict_records.py), and the verdict is computed over it for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.verdict_records import VerdictRecord

from acceptrun._util.hashing import hash_file
from acceptrun.spec.model import load_spec
from acceptrun.verdict import GROUPS, compute_verdict, format_verdict
from acceptrun.verdict.core import BEST_EFFORT_FAILED, Check
from acceptrun.verdict.decide import registered_checks
from acceptrun.verdict.diff import diff_runs, format_run_diff

# ---- the registry --------------------------------------------------------------------------


def test_each_registered_check_lives_in_its_group_module() -> None:
    modules = {fn.__module__.rsplit(".", 1)[-1] for fn in registered_checks()}
    assert modules == set(GROUPS)
    assert len(set(registered_checks())) == len(registered_checks())


def test_checks_are_sorted_by_group_in_the_order_of_the_acceptance_tests(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance.metrics]\n"loss" = "<= 1"\n')
    rb.training()
    rb.at(20.0, "metric", name="loss", value=0.5)
    groups = [c.group for c in rb.compute().checks]
    order = list(GROUPS)
    assert groups == sorted(groups, key=order.index)
    assert groups[0] == "setup" and groups[-1] == "results"


# ---- 1. setup ----------------------------------------------------------------------------


def test_provenance_pass_names_what_is_absent(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.write_json("provenance.json", {"python": {"version": "3.11"}, "git": {"absent": True}})
    c = rb.check("provenance")
    assert (c.status, c.required, c.evidence) == ("pass", True, "environment recorded; absent: git")


def test_provenance_missing_is_not_recorded_and_required(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path).check("provenance")
    assert (c.status, c.required) == ("not_recorded", True)
    assert c.fix and "acceptrun run" in c.fix


def test_preflight_checks_pass_and_fail_with_their_fix(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.preflight(("expectations", True, "torch 2.13 as expected"),
                 ("resources", False, "1 GPU asked, 0 found"), ("data", True, "ignored here"))  # fmt: skip
    assert rb.check("expectations").status == "pass"
    res = rb.check("resources")
    assert (res.status, res.required, res.evidence) == ("fail", True, "1 GPU asked, 0 found")
    assert res.fix and "[resources]" in res.fix
    assert not [c for c in rb.compute().checks if c.group == "setup" and c.name == "data"]


def test_preflight_missing_is_not_recorded_and_required(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path).check("expectations")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "no preflight.json")


def test_standalone_run_has_no_preflight_to_require(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, mode="standalone").check("expectations")
    assert (c.status, c.required) == ("not_recorded", False)


def test_first_step_within_max_first_step_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\nmax_first_step = "10s"\n')
    rb.training(start=2.0, step_time=1.0)
    c = rb.check("first step")
    assert (c.status, c.required, c.evidence) == (
        "pass",
        True,
        "attempt 1's first step 3.0s after launch, at most 10s",
    )


def test_first_step_later_than_max_first_step_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\nmax_first_step = "10s"\n')
    rb.training(start=20.0, step_time=1.0)
    c = rb.check("first step")
    assert (c.status, c.required) == ("fail", True)
    assert c.evidence.startswith("attempt 1's first step 21s after launch") and c.fix


def test_first_step_without_steps_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\nmax_first_step = "10s"\n')  # run_start only
    c = rb.check("first step")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "no step events")


def test_first_step_without_a_limit_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training(start=2.0, step_time=1.0)
    c = rb.check("first step")
    assert (c.status, c.required) == ("pass", False)


def test_spec_warning_is_an_information_check(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("spec_warning", key="checkpoint.every_steps", message="no effect", fix="use run.maybe_checkpoint")  # fmt: skip
    c = rb.check("spec checkpoint.every_steps")
    assert (c.group, c.status, c.required) == ("setup", "not_recorded", False)
    assert c.evidence == "no effect; use run.maybe_checkpoint"


# ---- 2. data and checkpoints ---------------------------------------------------------------

DATA = '[data]\npath = "data"\nmanifest = "data.manifest.json"\n'


def test_data_verified_against_its_manifest_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DATA)
    rb.preflight(("data", True, "12 files match the manifest"), data={"verified": True})
    c = rb.check("data verified")
    assert (c.status, c.required, c.evidence) == ("pass", True, "12 files match the manifest")


def test_data_that_differs_from_its_manifest_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DATA)
    rb.preflight(("data", False, "2 files changed"), data={"verified": True})
    c = rb.check("data verified")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and "acceptrun data snapshot" in c.fix


def test_data_without_a_preflight_check_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DATA)
    rb.preflight(("expectations", True, "ok"))
    c = rb.check("data verified")
    assert (c.status, c.required) == ("not_recorded", True)


def test_data_without_a_manifest_is_not_verified_and_not_required(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[data]\npath = "data"\n')
    rb.preflight(("data", True, "data found, no manifest"), data={"verified": False})
    c = rb.check("data verified")
    assert (c.status, c.required, c.fix) == ("not_recorded", False, "add data.manifest to the spec")


def test_no_data_in_the_spec_is_information(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path).check("data verified")
    assert (c.status, c.required, c.evidence) == ("not_recorded", False, "the spec names no data")


CKPT = "[checkpoint]\nevery_steps = 5\n"


def test_last_checkpoint_that_verifies_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CKPT)
    rb.checkpoint(5)
    rb.checkpoint(10)
    c = rb.check("last checkpoint")
    assert (c.status, c.required) == ("pass", True)
    assert c.evidence.startswith("step 10 verified (1 files, 0.0 MB,")


def test_damaged_last_checkpoint_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CKPT)
    rb.checkpoint(10, b"weights")
    (rb.record.checkpoints_dir / "step-10" / "model.pt").write_bytes(b"WEIGHTS")  # same size
    c = rb.check("last checkpoint")
    assert (c.status, c.required) == ("fail", True)
    assert "model.pt" in c.evidence and c.fix and "ckpt verify" in c.fix


def test_configured_checkpoints_never_committed_are_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, CKPT).check("last checkpoint")
    assert (c.status, c.required) == ("not_recorded", True)


def test_no_checkpoint_check_when_none_configured_or_committed(tmp_path: Path) -> None:
    assert VerdictRecord(tmp_path).checks("last checkpoint") == []


def test_mirror_ok_passes_and_behind_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CKPT + 'mirror = "/srv/mirror"\n')
    rb.checkpoint(10)
    rb.write_json("mirror.json", {"steps": {"10": {"state": "ok"}}})
    assert rb.check("mirror").status == "pass"
    rb.write_json("mirror.json", {"steps": {"10": {"state": "failed"}}})
    c = rb.check("mirror")
    assert (c.status, c.required, c.evidence) == ("fail", True, "step 10 on /srv/mirror: failed")
    assert c.fix and "credentials" in c.fix


def test_mirror_that_was_never_handed_a_step_names_the_save_path(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CKPT + 'mirror = "/srv/mirror"\n')
    rb.checkpoint(10)
    rb.write_json("mirror.json", {"steps": {}})
    c = rb.check("mirror")
    assert c.status == "fail" and c.fix and "run.checkpoint_store()" in c.fix
    assert "credentials" not in c.fix


def test_mirror_without_mirror_json_fails_as_not_recorded_state(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CKPT + 'mirror = "/srv/mirror"\n')
    rb.checkpoint(10)
    c = rb.check("mirror")
    assert (c.status, c.evidence) == ("fail", "step 10 on /srv/mirror: not recorded")
    assert c.fix and "run.checkpoint_store()" in c.fix


DRILLS = '[acceptance]\ndrills = ["restore", "kill"]\n'


@pytest.mark.parametrize(
    ("ok", "status"),
    [pytest.param(True, "pass", id="pass"), pytest.param(False, "fail", id="fail")],
)
def test_restore_drill_result_is_a_data_check(tmp_path: Path, ok: bool, status: str) -> None:
    rb = VerdictRecord(tmp_path, DRILLS)
    rb.training()
    rb.at(30.0, "drill", drill="restore", ok=ok, evidence="restored step 10 in 0.4s")
    c = rb.check("drill restore")
    assert (c.group, c.status, c.required, c.evidence) == (
        "data",
        status,
        True,
        "restored step 10 in 0.4s",
    )
    assert (c.fix is None) == ok


def test_restore_drill_never_run_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS)
    rb.training()
    c = rb.check("drill restore")
    assert (c.group, c.status, c.required) == ("data", "not_recorded", True)
    assert c.fix and "ckpt drill" in c.fix


def test_black_box_checkpoints_unknown_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("usage", usage="black box")
    rb.training()
    c = rb.check("checkpoints")
    assert (c.group, c.status, c.required) == ("data", "not_recorded", False)
    assert c.evidence.startswith("not checked: a black box's own checkpoints")


def test_black_box_with_watched_checkpoints_has_no_such_check(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[checkpoint]\nwatch = ["ckpt/*.pt"]\n')
    rb.event("usage", usage="black box")
    assert rb.checks("checkpoints") == []


# ---- 3. performance and observability ------------------------------------------------------

RUNTIME = '[limits]\nexpected_runtime = ["5s", "1m"]\n'


def test_runtime_in_range_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, RUNTIME)
    rb.training(steps=10)
    c = rb.check("runtime")
    assert (c.status, c.required, c.evidence) == ("pass", True, "10s, expected 5.0s to 1m00s")


@pytest.mark.parametrize(
    ("steps", "fix"),
    [pytest.param(2, "ended early", id="short"), pytest.param(100, "slowed", id="long")],
)
def test_runtime_out_of_range_fails(tmp_path: Path, steps: int, fix: str) -> None:
    rb = VerdictRecord(tmp_path, RUNTIME)
    rb.training(steps=steps)
    c = rb.check("runtime")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and fix in c.fix


def test_runtime_without_start_and_end_is_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, RUNTIME).check("runtime")
    assert (c.status, c.required) == ("not_recorded", True)


THROUGHPUT = '[acceptance]\nthroughput = [5, 20]\nthroughput_unit = "samples/s"\n'


def test_throughput_in_range_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, THROUGHPUT)
    rb.training(steps=10, step_time=1.0, samples=10)
    c = rb.check("throughput")
    assert (c.status, c.required, c.evidence) == (
        "pass",
        True,
        "model throughput median 10 samples/s, expected 5 to 20",
    )


@pytest.mark.parametrize(
    ("samples", "fix"),
    [pytest.param(2, "bottleneck", id="slow"), pytest.param(50, "faster than expected", id="fast")],
)
def test_throughput_out_of_range_fails(tmp_path: Path, samples: int, fix: str) -> None:
    rb = VerdictRecord(tmp_path, THROUGHPUT)
    rb.training(steps=10, step_time=1.0, samples=samples)
    c = rb.check("throughput")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and fix in c.fix


def test_throughput_in_another_unit_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, THROUGHPUT)
    rb.training(steps=10, step_time=1.0)
    c = rb.check("throughput")
    assert (c.status, c.required, c.evidence) == (
        "not_recorded",
        True,
        "no samples/s recorded (1 steps/s)",
    )


def test_throughput_without_a_range_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training(steps=10, step_time=0.5, samples=5)
    c = rb.check("throughput")
    assert (c.status, c.required, c.evidence) == (
        "pass",
        False,
        "model throughput median 10 samples/s (no range in the spec)",
    )


def test_data_wait_below_the_limit_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[acceptance]\nmax_data_wait = 0.25\n")
    rb.training(steps=10, step_time=1.0, data_wait=0.1)
    c = rb.check("data wait")
    assert (c.status, c.required, c.evidence) == (
        "pass", True, "10.0% of step time waiting for data, at most 25%")  # fmt: skip


def test_data_wait_above_the_limit_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[acceptance]\nmax_data_wait = 0.25\n")
    rb.training(steps=10, step_time=1.0, data_wait=0.5)
    c = rb.check("data wait")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and "DataLoader" in c.fix


def test_data_wait_over_too_little_step_time_is_not_required(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[acceptance]\nmax_data_wait = 0.25\n")
    rb.training(steps=2, step_time=1.0, data_wait=0.5)
    c = rb.check("data wait")
    assert (c.status, c.required) == ("fail", False)
    assert c.evidence.endswith("(only 2.0s of steps: too little to judge)")


def test_data_wait_never_timed_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    c = rb.check("data wait")
    assert (c.status, c.required) == ("not_recorded", False)
    assert c.fix == "wrap the batch fetch in `with run.data_wait():`"


def _gpu_samples(rb: VerdictRecord, util: float, n: int = 10) -> None:
    for i in range(n):
        rb.sample("host", t=3.0 + i, cpu_pct=50.0, proc_cpu_pct=90.0)
        rb.sample("gpu", t=3.0 + i, index=0, util_pct=util, name="H100")


def test_idle_gpu_below_the_limit_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[resources]\ngpus = 1\n")
    rb.training()
    _gpu_samples(rb, util=95.0)
    c = rb.check("idle")
    assert (c.status, c.required) == ("pass", True)
    assert c.evidence.startswith("device idle in 0.0% of samples (GPU utilization below 5%")


def test_idle_gpu_above_the_limit_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[resources]\ngpus = 1\n")
    rb.training()
    _gpu_samples(rb, util=0.0)
    c = rb.check("idle")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and "idle_action" in c.fix


def test_idle_on_cpu_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    rb.sample("host", t=3.0, proc_cpu_pct=1.0)
    c = rb.check("idle")
    assert (c.status, c.required) == ("fail", False)
    assert c.evidence.endswith("; CPU only")


def test_idle_without_samples_has_no_check(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    assert rb.checks("idle") == []


def test_telemetry_with_gpu_samples_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[resources]\ngpus = 1\n")
    _gpu_samples(rb, util=95.0, n=3)
    c = rb.check("telemetry")
    assert (c.status, c.required, c.evidence) == ("pass", True, "3 host samples, 3 GPU samples")


def test_gpu_run_without_gpu_samples_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[resources]\ngpus = 1\n")
    rb.sample("host", cpu_pct=10.0)
    rb.sample("gpu_absent", reason="NVML not found")
    rb.sample("sampler_error", sampler="gpu", error="NVMLError")
    c = rb.check("telemetry")
    assert (c.status, c.required) == ("fail", True)
    assert (
        c.evidence
        == "1 host samples, no GPU samples (NVML not found), sampler errors: gpu: NVMLError"
    )


def test_telemetry_without_samples_is_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, "[resources]\ngpus = 1\n").check("telemetry")
    assert (c.status, c.required) == ("not_recorded", True)


def test_black_box_without_step_events_says_step_time_was_not_checked(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("usage", usage="unknown")
    c = rb.check("step time")
    assert (c.group, c.status, c.required) == ("performance", "not_recorded", False)
    assert "a command of unknown kind wrote no step events" in c.evidence


def test_client_run_has_no_black_box_checks(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("usage", usage="client")
    names = {c.name for c in rb.compute().checks}
    assert not names & {"step time", "lost work", "checkpoints", "outputs"}


# ---- 4. operations -------------------------------------------------------------------------


def test_exit_of_a_successful_last_attempt_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    c = rb.check("exit")
    assert (c.status, c.required, c.evidence) == (
        "pass",
        True,
        "attempt 1 exited 0 after 10s",
    )


@pytest.mark.parametrize(
    ("outcome", "cls", "fix"),
    [
        pytest.param("failed", "cuda_oom", "lower the batch size", id="class-fix"),
        pytest.param("failed", None, "read attempts/1/stderr.log", id="no-class"),
        pytest.param("wall_time", "wall_time", "raise limits.wall_time", id="wall-time"),
    ],
)
def test_exit_of_a_failed_last_attempt_fails_with_the_fix(
    tmp_path: Path, outcome: str, cls: str | None, fix: str
) -> None:
    rb = VerdictRecord(tmp_path)
    rb.attempt(outcome, reason="exited 1", failure_class=cls)
    c = rb.check("exit")
    assert (c.status, c.required) == ("fail", True)
    assert c.fix and c.fix.startswith(fix)


def test_exit_without_attempts_is_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path).check("exit")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "no attempt ran")


@pytest.mark.parametrize(
    ("ends", "status"),
    [pytest.param(["ok"], "pass", id="ok"), pytest.param(["error"], "fail", id="error"),
     pytest.param([], "not_recorded", id="no-end")],
)  # fmt: skip
def test_exit_of_a_standalone_run_reads_workload_end(
    tmp_path: Path, ends: list[str], status: str
) -> None:
    rb = VerdictRecord(tmp_path, mode="standalone")
    for s in ends:
        rb.event("workload_end", status=s)
    c = rb.check("exit")
    assert (c.status, c.required) == (status, True)
    assert rb.checks("restarts") == []


def test_resumed_and_failures_describe_earlier_attempts(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.attempt("signaled", reason="killed by SIGKILL", failure_class="killed",
               work={"steps_lost": 3, "seconds_lost": 4.0, "device_seconds_lost": 4.0})  # fmt: skip
    rb.attempt()
    rb.at(5.0, "restart", attempt=1)
    rb.at(6.0, "restored", attempt=2, step=5, seconds=0.25)
    resumed, failures = rb.check("resumed"), rb.check("failures")
    assert (resumed.status, resumed.required) == ("pass", False)
    assert resumed.evidence == "attempt 2 from step 5 (0.25s)"
    assert (
        failures.evidence
        == "attempt 1: killed (killed by SIGKILL); lost 3 steps, 4.0s (4.0 device-s)"
    )
    assert (rb.check("restarts").status, rb.check("restarts").evidence) == (
        "pass",
        "1 of at most 3",
    )


def test_restarts_beyond_max_restarts_fail(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[limits]\nmax_restarts = 1\n")
    rb.training()
    rb.at(30.0, "restart")
    rb.at(31.0, "restart")
    c = rb.check("restarts")
    assert (c.status, c.required, c.evidence) == ("fail", True, "2 of at most 1")


def test_kill_drill_passed_in_this_run(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS)
    rb.training()
    rb.at(30.0, "drill", drill="kill", ok=True, evidence="bitwise equal")
    c = rb.check("drill kill")
    assert (c.group, c.status, c.evidence) == ("operations", "pass", "bitwise equal")


def test_kill_drill_skipped_stays_unproven(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS)
    rb.training()
    rb.at(30.0, "drill", drill="kill", skipped=True, evidence="not applicable")
    c = rb.check("drill kill")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "not applicable")


def test_kill_drill_failed_in_a_drill_run_of_the_same_spec(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS, spec_hash="xxh3:1")
    rb.training()
    drill = VerdictRecord(tmp_path, DRILLS, run_id="20261201-110000-t-0000", spec_hash="xxh3:1",
                          drill={"reference": "r"})  # fmt: skip
    drill.event("drill", drill="kill", ok=False, evidence="losses differ at step 7")
    c = rb.check("drill kill")
    assert (c.status, c.required) == ("fail", True)
    assert (
        c.evidence
        == "failed in drill run 20261201-110000-t-0000 of the same spec: losses differ at step 7"
    )


def test_kill_drill_never_run_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS, spec_hash="xxh3:1")
    rb.training()
    c = rb.check("drill kill")
    assert (c.status, c.evidence) == ("not_recorded", "no result recorded for this drill")


def test_unreadable_neighbour_is_recorded_and_named(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, DRILLS, spec_hash="xxh3:1")
    rb.training()
    (rb.record.path.parent / "20261201-100000-t-dead").mkdir()  # a run directory without run.json
    c = rb.check("drill kill")
    assert c.status == "not_recorded"
    assert "1 other run record(s) could not be read: drill kill: reading run 20261201-100000-t-dead failed: RecordError" in c.evidence  # fmt: skip
    failed = list(rb.record.events(BEST_EFFORT_FAILED))
    assert failed and failed[-1]["component"] == "drill kill: reading run 20261201-100000-t-dead"
    assert "Traceback" in failed[-1]["traceback"]


CLEANUP = '[cleanup]\ncommands = ["rm -rf /tmp/scratch"]\n'


def test_cleanup_done_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CLEANUP)
    rb.training()
    rb.at(30.0, "cleanup", command="rm -rf /tmp/scratch", ok=True, removed=["/tmp/scratch"])
    c = rb.check("cleanup")
    assert (c.status, c.required, c.evidence) == ("pass", True, "1 step done, 1 path removed")


def test_cleanup_that_failed_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CLEANUP)
    rb.training()
    rb.at(30.0, "cleanup", command="rm -rf /tmp/scratch", ok=False, detail="exit 1")
    c = rb.check("cleanup")
    assert (c.status, c.evidence) == ("fail", "1 of 1 failed: rm -rf /tmp/scratch: exit 1")


def test_cleanup_whose_removal_was_refused_fails(tmp_path: Path) -> None:
    """A removal the path guard refused (here: the workspace) is never a ✓."""
    rb = VerdictRecord(tmp_path, CLEANUP)
    rb.training()
    rb.at(30.0, "cleanup", remove=".*", ok=False, removed=["/w/.cache"],
          detail="refused: /w/.acceptrun is in a workspace (.acceptrun)")  # fmt: skip
    c = rb.check("cleanup")
    assert c.status == "fail" and "refused: /w/.acceptrun" in c.evidence, c
    assert c.evidence.endswith("1 path removed")
    assert "narrow the [cleanup] remove glob" in str(c.fix)


def test_cleanup_never_ran_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, CLEANUP)
    rb.training()
    assert rb.check("cleanup").status == "not_recorded"


def test_injected_fault_that_fired_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, injected=["kill@step=5"])
    rb.training()
    rb.at(8.0, "fault_injected", attempt=1, action="kill", step=5)
    c = rb.check("injected faults")
    assert (c.status, c.required, c.evidence) == (
        "pass",
        True,
        "1 fault fired as requested: kill@step=5",
    )


def test_injected_fault_that_never_fired_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, injected=["kill@step=40"])
    rb.training(steps=10)
    c = rb.check("injected faults")
    assert (c.status, c.required) == ("fail", True)
    assert c.evidence == "kill@step=40 requested, the run ended at step 10 without it firing"


LEDGER = {
    "priced": True,
    "compute": {"usd": 2.5, "split_s": {"compute": 3000.0, "idle": 600.0}},
    "price": {"label": "lambda gpu_1x_h100"},
    "total_usd": 2.6,
}


@pytest.mark.parametrize(
    ("budget", "status"),
    [pytest.param(10, "pass", id="within"), pytest.param(2, "fail", id="over")],
)
def test_budget_against_the_priced_ledger(tmp_path: Path, budget: int, status: str) -> None:
    rb = VerdictRecord(tmp_path, f"[limits]\nbudget_usd = {budget}\n")
    rb.write_json("ledger.json", LEDGER)
    c = rb.check("budget")
    assert (c.status, c.required) == (status, True)
    assert c.evidence.endswith(" USD (lambda gpu_1x_h100)")
    cost = rb.check("cost")
    assert (cost.status, cost.required) == ("pass", False)
    assert "(compute 83%, no step 17%)" in cost.evidence  # the ledger's idle: no step ran


def test_budget_without_a_priced_ledger_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, "[limits]\nbudget_usd = 10\n")
    rb.write_json("ledger.json", {"priced": False})
    c = rb.check("budget")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "no priced ledger.json")
    assert rb.checks("cost") == []


def test_black_box_lost_work_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("usage", usage="black box")
    c = rb.check("lost work")
    assert (c.group, c.status, c.required) == ("operations", "not_recorded", False)


# ---- 5. exit -------------------------------------------------------------------------------


def test_portability_without_blockers_passes_with_its_warnings(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path).check("portability")
    assert (c.status, c.required) == ("pass", True)
    assert c.evidence.startswith("no blockers; 1 warning: provenance.git (code)")


def test_portability_blocker_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.write_json("provenance.json", {"git": {"root": str(tmp_path / "code"), "remote": "git@h:r",
                                              "dirty": True}})  # fmt: skip
    c = rb.check("portability")
    assert (c.status, c.required) == ("fail", True)
    assert c.evidence.startswith("git.diff: the working tree had uncommitted changes")


def test_portability_that_raises_is_recorded_not_swallowed(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    spec = load_spec(rb.record.spec_path)
    rb.record.spec_path.write_text("name = [unclosed\n")  # the frozen spec is damaged
    [c] = [c for c in compute_verdict(rb.record, spec).checks if c.name == "portability"]
    assert (c.status, c.required) == ("not_recorded", False)
    assert c.evidence.startswith("portability failed: SpecError: ")
    assert c.evidence.endswith("; see events")
    [ev] = rb.record.events(BEST_EFFORT_FAILED)
    assert ev["component"] == "portability" and ev["error"].startswith("SpecError: ")
    assert "check_run" in ev["traceback"]


# ---- results -------------------------------------------------------------------------------

METRIC = '[acceptance.metrics]\n"loss" = "<= 1.0"\n'


@pytest.mark.parametrize(
    ("value", "status"),
    [pytest.param(0.5, "pass", id="meets"), pytest.param(1.5, "fail", id="misses"),
     pytest.param(float("nan"), "fail", id="nan")],
)  # fmt: skip
def test_metric_condition(tmp_path: Path, value: float, status: str) -> None:
    rb = VerdictRecord(tmp_path, METRIC)
    rb.event("metric", name="loss", value=2.0)
    rb.at(1.0, "metric", name="loss", value=value)  # the last value counts
    c = rb.check("metric loss")
    assert (c.status, c.required) == (status, True)


def test_metric_never_reported_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, METRIC)
    rb.event("metric", name="acc", value=0.9)
    c = rb.check("metric loss")
    assert (c.status, c.evidence) == ("not_recorded", "never reported (metrics seen: acc)")


def test_a_metric_of_one_attempt_is_refused_with_the_reason(tmp_path: Path) -> None:
    from acceptrun.workload.aggregates import marks

    rb = VerdictRecord(tmp_path, '[acceptance.metrics]\n"train_loss" = "<= 100"\n')
    rb.event("metric", name="train_loss", value=2.89, attempt=2,
             **marks("transformers", "train_loss"))  # fmt: skip
    c = rb.check("metric train_loss")
    assert (c.status, c.required) == ("fail", True), c
    assert "refused as an acceptance metric: 2.89 (attempt 2)" in c.evidence, c.evidence
    assert "eval_loss" in (c.fix or ""), c.fix


def _output(rb: VerdictRecord, tmp_path: Path, name: str = "model") -> Path:
    path = tmp_path / f"{name}.pt"
    path.write_bytes(b"trained weights")
    rb.event("output", name=name, path=str(path), hash=hash_file(path)[0])
    return path


def test_declared_output_unchanged_passes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\noutputs = ["model"]\n')
    path = _output(rb, tmp_path)
    c = rb.check("output model")
    assert (c.status, c.required) == ("pass", True)
    assert c.evidence.startswith(f"{path} (15 B, xxh3")


def test_output_changed_or_gone_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\noutputs = ["model"]\n')
    path = _output(rb, tmp_path)
    path.write_bytes(b"other weights!!")
    assert "changed after it was registered" in rb.check("output model").evidence
    path.unlink()
    c = rb.check("output model")
    assert (c.status, c.evidence) == ("fail", f"{path} is gone")


def test_declared_output_never_registered_is_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, '[acceptance]\noutputs = ["model"]\n').check("output model")
    assert (c.status, c.required) == ("not_recorded", True)


def test_declared_output_not_found_fails(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\noutputs = ["model"]\n')
    rb.event("output_missing", name="model", pattern="out/*.pt", attempt=1, reason="no match")
    c = rb.check("output model")
    assert (c.status, c.required) == ("fail", True)
    assert c.evidence == "declared as 'out/*.pt' in [outputs], not found after attempt 1: no match"


def test_outputs_not_asked_for_are_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    _output(rb, tmp_path, "extra")
    rb.event("output_missing", name="log", reason="no match")
    assert (rb.check("output extra").status, rb.check("output extra").required) == ("pass", False)
    assert (rb.check("output log").status, rb.check("output log").required) == ("fail", False)


def test_black_box_without_outputs_is_information(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.event("usage", usage="black box")
    c = rb.check("outputs")
    assert (c.group, c.status, c.required) == ("results", "not_recorded", False)


# ---- the telemetry summary failed ----------------------------------------------------------


def _broken_summary(rb: VerdictRecord) -> None:
    """A GPU sample whose index is a list: summarize() cannot group samples by it."""
    rb.sample("gpu", t=3.0, index=[0], util_pct=50.0)


def test_summary_failure_is_recorded_and_named_in_the_checks_that_need_it(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, THROUGHPUT + "max_data_wait = 0.25\nmax_idle = 0.25\n")
    rb.training(samples=10, data_wait=0.1)
    _broken_summary(rb)
    verdict = rb.compute()
    by_name = {c.name: c for c in verdict.checks}
    [ev] = rb.record.events(BEST_EFFORT_FAILED)
    assert ev["component"] == "summary" and ev["error"].startswith("TypeError: unhashable type")
    assert "summarize" in ev["traceback"]
    expected = f"summary failed: {ev['error']}; see events"
    for name in ("throughput", "data wait", "idle"):
        c = by_name[name]
        assert (c.status, c.evidence) == ("not_recorded", expected), name
    assert by_name["throughput"].required and not verdict.accepted
    # The first step is also timed from the events alone; the evidence names the failure.
    first = by_name["first step"]
    assert (first.status, first.evidence) == (
        "pass",
        f"attempt 1's first step 1.0s after its start ({expected})",
    )
    # Computed again over the same record: the same evidence, the failure recorded once.
    again = {c.name: c for c in rb.compute().checks}
    assert again["throughput"].evidence == expected
    assert len(list(rb.record.events(BEST_EFFORT_FAILED))) == 1


def test_summary_failure_without_steps_leaves_first_step_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, '[acceptance]\nmax_first_step = "1m"\n')  # run_start only
    _broken_summary(rb)
    c = rb.check("first step")
    assert (c.status, c.required) == ("not_recorded", True)
    assert c.evidence.startswith("summary failed: TypeError") and c.evidence.endswith(
        "; see events"
    )


def test_a_verdict_over_a_sound_record_records_no_failure(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, THROUGHPUT)
    rb.training(samples=10)
    rb.compute()
    assert list(rb.record.events(BEST_EFFORT_FAILED)) == []


def test_format_verdict_marks_information_and_fixes(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    text = format_verdict(rb.compute(), name="t")
    lines = text.splitlines()
    assert lines[0] == "REJECTED  t  20261201-120000-t-0001"
    assert lines[1] == GROUPS["setup"] and lines[2].startswith("  – provenance")
    assert "fix: run through `acceptrun run` or `acceptrun.init()`" in text
    assert "the spec names no data (info)" in text


def test_verdict_to_dict_lists_the_failed_required_checks(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path)
    rb.training()
    d = rb.compute().to_dict()
    assert d["verdict"] == "rejected" and d["failed"] == ["provenance", "expectations"]
    assert json.loads(json.dumps(d))["checks"][0]["status"] == "not_recorded"
    assert all(isinstance(c, Check) for c in rb.compute().checks)


# ---- verdict/diff.py -----------------------------------------------------------------------


def test_diff_with_run_a_spec_that_no_longer_loads_compares_exactly_and_says_why(
    tmp_path: Path,
) -> None:
    a = VerdictRecord(tmp_path, '[acceptance.tolerances]\n"loss" = 0.1\n')
    b = VerdictRecord(tmp_path, run_id="20261201-130000-t-0002")
    for rb, loss in ((a, 0.50), (b, 0.55)):
        rb.event("metric", name="loss", value=loss)
    assert diff_runs(a.record, b.record).reproduced  # within the tolerance
    a.record.spec_path.write_text("name = [unclosed\n")
    d = diff_runs(a.record, b.record)
    assert not d.reproduced and d.differences[0].startswith("metric loss: 0.5 vs 0.55")
    [note] = d.notes
    assert note.startswith("diff: tolerances of run A failed: SpecError: ")
    assert note.endswith("; see events; every metric and the loss must match exactly")
    assert f"  note: {note}" in format_run_diff(d) and d.to_dict()["notes"] == [note]
    [ev] = a.record.events(BEST_EFFORT_FAILED)
    assert ev["component"] == "diff: tolerances of run A" and "load_spec" in ev["traceback"]


# ---- a batch inference or serving run's own checks -----------------------------------------

SERVING = """[serving]
url = "http://127.0.0.1:8000/v1/chat"
ready_log = "running"
concurrency = 2
requests = 10
max_cold_start = 30
"""


@pytest.mark.parametrize(
    ("first_success_s", "status"),
    [pytest.param(4.0, "pass", id="warm"), pytest.param(45.0, "fail", id="cold")],
)
def test_serving_ready_within_max_cold_start(
    tmp_path: Path, first_success_s: float, status: str
) -> None:
    rb = VerdictRecord(tmp_path, SERVING)
    rb.write_json("serving.json", {"ready": {"ok": True, "seconds": 3.0, "by": "log"},
                                   "first_success_s": first_success_s})  # fmt: skip
    checks = rb.compute().checks
    [ready] = [c for c in checks if c.name == "ready"]
    assert (ready.group, ready.status, ready.required) == ("setup", status, True)
    setup = [c.name for c in checks if c.group == "setup"]
    assert setup[-1] == "ready"  # after the setup group's own checks
    # No load was sent: the serving run's load check fails.
    assert rb.check("load").status == "fail"


def test_serving_without_serving_json_is_not_recorded(tmp_path: Path) -> None:
    c = VerdictRecord(tmp_path, SERVING).check("ready")
    assert (c.status, c.required, c.evidence) == (
        "not_recorded",
        True,
        "no serving.json in the record",
    )


INFERENCE = '[inference]\ninput = "items.jsonl"\n'


@pytest.mark.parametrize(
    ("coverage", "status"),
    [pytest.param(1.0, "pass", id="all"), pytest.param(0.5, "fail", id="half")],
)
def test_inference_coverage(tmp_path: Path, coverage: float, status: str) -> None:
    rb = VerdictRecord(tmp_path, INFERENCE)
    rb.write_json("inference.json", {"items": 10, "coverage": coverage, "outputs": 10})
    c = rb.check("coverage")
    assert (c.group, c.status, c.required) == ("results", status, True)


def test_inference_with_unreadable_input_is_not_recorded(tmp_path: Path) -> None:
    rb = VerdictRecord(tmp_path, INFERENCE)
    rb.write_json("inference.json", {"error": "items.jsonl: no such file"})
    c = rb.check("coverage")
    assert (c.status, c.required, c.evidence) == ("not_recorded", True, "items.jsonl: no such file")


@pytest.mark.parametrize("required", [True, False])
@pytest.mark.parametrize("status", ["pass", "fail", "not_recorded"])
def test_only_a_required_failure_wears_the_cross_in_every_view(
    tmp_path: Path, status: str, required: bool
) -> None:
    from acceptrun.report.data import report_data
    from acceptrun.report.html import render_html
    from acceptrun.report.markdown import render_markdown
    from acceptrun.verdict.core import Verdict

    rb = VerdictRecord(tmp_path)
    rb.training()
    check = Check("performance", "idle", status, required, "idle 33.3% of the run")
    verdict = Verdict(rb.record.run_id, [check], "2026-12-04T00:00:00Z")
    data = report_data(rb.record)
    data["verdict"] = {**verdict.to_dict(), "provisional": False}
    views = {
        "terminal": format_verdict(verdict),
        "markdown": render_markdown(data),
        "html": render_html(data),
    }
    crossed = status == "fail" and required
    for view, text in views.items():
        lines = [ln for ln in text.splitlines() if "idle 33.3%" in ln]
        assert lines, view
        assert any("✗" in ln or "FAIL" in ln for ln in lines) is crossed, (view, lines)
        if status == "fail" and not required:
            assert all("info" in ln for ln in lines), (view, lines)
    assert verdict.accepted is (status == "pass" or not required)
