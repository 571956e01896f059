"""acceptrun tune: the batch search, real memory limits, the sweep on the tiny target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from acceptrun.tune import TuneConfig, read_best
from acceptrun.tune.sweep import run_child

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT / 'examples' / 'tune_tiny' / 'target.py'}:target"

# 16 MiB of input per sample, nothing else of note (about 1 MiB more per step, measured):
# the boundary under a cap is sharp.
MEM_TARGET = """
import os, signal
import torch
from acceptrun.tune.target import Built, TuneConfig, TuneTarget

KILL_ABOVE = int(os.environ.get("MEM_TARGET_KILL_ABOVE", "0"))

class Mem(TuneTarget):
    name = "mem"

    def default_config(self):
        return TuneConfig(batch_size=1)

    def build(self, config, device):
        model = torch.nn.Linear(1024, 1)
        opt = config.adamw(model.parameters(), lr=1e-3)

        def make_batch(n):
            if KILL_ABOVE and n > KILL_ABOVE:
                os.kill(os.getpid(), signal.SIGKILL)  # a crash no Python code can catch
            return torch.ones(n, 4096, 1024)

        return Built(model, opt, make_batch, lambda m, x: m(x).mean())

target = Mem()
"""


@pytest.mark.slow
def test_oom_search_under_a_real_address_space_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mem_target.py").write_text(MEM_TARGET)
    target = f"{tmp_path / 'mem_target.py'}:target"
    # Bytes beyond torch itself. Batch 4 takes 64 MiB (+1 MiB), batch 5 80 MiB: the cap lies
    # midway, so what the process frees or keeps around the cap (1 MiB or so, varying by
    # machine) cannot move the boundary.
    cap = 72 << 20

    def job(mode: str, batch: int, **extra: object) -> dict[str, object]:
        return {"mode": mode, "target": target, "device": "cpu", "config": {"batch_size": batch},
                "memory_limit": cap, "warmup": 1, "steps": 1, "check_steps": 1, **extra}  # fmt: skip

    found = run_child(
        job("search", 1, search={"start": 1, "limit": 256}), timeout=240, workdir=tmp_path
    )
    assert found["ok"], found
    top = found["max_batch"]
    assert top == 4 and not found["capped"], found
    failed = [p for p in found["probes"] if not p[1]]
    assert failed and all("allocate" in p[2] for p in failed)  # the allocator's real failure
    # The boundary holds in a fresh process too: top fits, top + 1 does not.
    assert run_child(job("trial", top), timeout=240, workdir=tmp_path)["ok"]
    over = run_child(job("trial", top + 1), timeout=240, workdir=tmp_path)
    assert not over["ok"] and over["oom"]
    # A trial that dies for real (SIGKILL) is reported; the parent carries on.
    monkeypatch.setenv("MEM_TARGET_KILL_ABOVE", "2")
    dead = run_child(
        job("search", 1, search={"start": 1, "limit": 8}), timeout=240, workdir=tmp_path
    )
    assert dead == {"ok": False, "oom": True, "error": dead["error"]}
    assert "killed by SIGKILL" in dead["error"]


@pytest.mark.slow
def test_tune_sweep_on_the_tiny_target(tmp_path: Path) -> None:
    out = tmp_path / "best.toml"
    cmd = [sys.executable, "-m", "acceptrun", "--workspace", str(tmp_path / "ws"), "tune", TINY,
           "--device", "cpu", "--axes", "precision,batch", "--warmup", "1", "--steps", "3",
           "--check-steps", "2", "--max-batch", "16", "--memory-limit", "1GiB", "--threads", "1",
           "--no-confirm", "--out", str(out)]  # fmt: skip
    scratch = tmp_path / "tmp"  # the trials' folder goes here, and away with the sweep
    scratch.mkdir()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(scratch)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert not list(scratch.glob("acceptrun-tune-*"))
    table = proc.stdout
    for row in (
        "baseline",
        "fp32 b8",
        "precision",
        "bf16 b8",
        "batch",
        "samples/s",
        "numerics",
    ):
        assert row in table, table
    assert "the largest batch that fits is 16 (capped by --max-batch)" in table
    runs = list((tmp_path / "ws" / "runs").iterdir())
    assert len(runs) == 1
    record = runs[0]
    state = json.loads((record / "run.json").read_text())
    assert (state["mode"], state["status"]) == ("tune", "finished")
    assert json.loads((record / "provenance.json").read_text())["torch"]["version"]
    tune = json.loads((record / "tune.json").read_text())
    assert [t["axis"] for t in tune["trials"]][:3] == ["warm-up", "baseline", "precision"]
    assert all(t["ok"] for t in tune["trials"])
    # The batch axis starts from the precision the sweep chose, which is a measurement
    # (on a loaded machine bf16 can come out ahead of fp32): it tries that one at b16.
    (batch,) = [t for t in tune["trials"] if t["axis"] == "batch"]
    assert batch["label"] in ("fp32 b16", "bf16 b16") and batch["label"] in table, table
    base = tune["trials"][tune["baseline"]]
    assert base["numerics"] == "ok" and base["gain"] == 1.0 and len(base["step_times_s"]) == 3
    assert base["p25_s"] <= base["median_s"] <= base["p75_s"]
    best = tune["trials"][tune["best"]]
    assert read_best(str(out)) == TuneConfig.from_dict(best["config"])
    assert tune["gain"] == pytest.approx(best["samples_per_s"] / base["samples_per_s"])
    events = [json.loads(line) for line in (record / "events.jsonl").read_text().splitlines()]
    assert [e["id"] for e in events if e["kind"] == "trial"] == list(range(len(tune["trials"])))
    show = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(tmp_path / "ws"), "show", "latest"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"default  {base['label']}: " in show and "a tune record has no verdict" in show
    assert f"{len(tune['trials'])} trials" in show and "verdict  not decided" not in show


def test_the_baseline_is_timed_after_a_warm_up_like_every_other_trial(tmp_path: Path) -> None:
    """The first trial process pays the machine's cold start: it is run, never compared."""
    cmd = [sys.executable, "-m", "acceptrun", "--workspace", str(tmp_path / "ws"), "tune", TINY,
           "--device", "cpu", "--axes", "precision", "--warmup", "2", "--steps", "3",
           "--check-steps", "2", "--threads", "1", "--no-confirm"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (record,) = (tmp_path / "ws" / "runs").iterdir()
    tune = json.loads((record / "tune.json").read_text())
    trials = tune["trials"]
    warm, base = trials[tune["warm_up"]], trials[tune["baseline"]]
    # The warm-up is the default's own configuration, run just before the baseline.
    assert (warm["id"], base["id"]) == (0, 1) and warm["axis"] == "warm-up"
    assert warm["config"] == base["config"] and warm["ok"]
    # Every timed trial, the baseline among them, follows a trial process and has the
    # same untimed steps in its own process.
    assert all(len(t["warmup_times_s"]) == 2 and len(t["step_times_s"]) == 3 for t in trials)
    assert warm["gain"] is None and base["gain"] == 1.0 and tune["best"] != warm["id"]
    assert all(t["gain"] == pytest.approx(t["samples_per_s"] / base["samples_per_s"])
               for t in trials[1:])  # fmt: skip
    # The table marks the warm-up and the verdict line gives the baseline figure it used.
    assert "takes the machine's cold start; not compared" in proc.stdout
    assert f"{base['samples_per_s']:,.1f} samples/s after a warm-up run" in proc.stdout


def test_tune_refuses_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "tune", TINY, "--axes", "precision,warp"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--axes: unknown warp" in proc.stderr
    assert not (tmp_path / ".acceptrun").exists()


def test_tiny_target_describes_itself() -> None:
    script = textwrap.dedent(f"""
        from acceptrun.tune import load_target
        t = load_target({TINY!r})
        c = t.default_config()
        print(t.name, c.label(), t.uses_sdpa, t.supports_checkpointing, int(t.flops_per_sample(c)))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == [
        "tiny-encoder",
        "fp32",
        "b8",
        "True",
        "True",
        str(2 * (6 * 12 * 64 * 64 * 64 + 12 * 64 * 64 * 64)),
    ]
