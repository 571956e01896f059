"""acceptrun tune's batch search and config: the largest batch, candidates by halvings,
validation and the best file, a bad target named (real memory limits and the sweep:
tests/integration/test_tune.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun.errors import UserError
from acceptrun.telemetry.peaks import peak_tflops
from acceptrun.tune import TuneConfig, load_target, read_best
from acceptrun.tune.report import table_rows, write_best
from acceptrun.tune.search import batch_candidates, find_max_batch
from acceptrun.tune.sweep import TuneReport


@pytest.mark.parametrize(
    ("boundary", "start", "limit", "multiple", "expected", "capped"),
    [
        pytest.param(300, 8, 4096, 1, 300, False, id="bisect-to-exact"),
        pytest.param(300, 8, 4096, 8, 296, False, id="multiple-of-8"),
        pytest.param(10_000, 1, 512, 1, 512, True, id="capped"),
        pytest.param(5, 8, 64, 1, 0, False, id="start-does-not-fit"),
        pytest.param(8, 8, 64, 1, 8, False, id="only-start"),
    ],
)
def test_find_max_batch(
    boundary: int, start: int, limit: int, multiple: int, expected: int, capped: bool
) -> None:
    result = find_max_batch(lambda b: b <= boundary, start=start, limit=limit, multiple=multiple)
    assert (result.max_batch, result.capped) == (expected, capped)
    # doubling first, then never a probe above a failure or below a success
    oks = [b for b, ok in result.probes if ok]
    fails = [b for b, ok in result.probes if not ok]
    assert all(b <= boundary for b in oks) and all(b > boundary for b in fails)
    assert len(result.probes) <= 2 * 13


def test_batch_candidates_spread_by_halvings() -> None:
    assert batch_candidates(8, 300) == [300, 150, 75]
    assert batch_candidates(32, 296, multiple=8) == [296, 144, 72]
    assert batch_candidates(8, 8) == []


def test_config_validation_round_trip_and_best_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"precision is 'fp8'.*fp32, tf32, bf16, fp16"):
        TuneConfig(batch_size=4, precision="fp8")
    with pytest.raises(UserError, match="batch_size is 0"):
        TuneConfig(batch_size=0)
    config = TuneConfig(batch_size=64, precision="bf16", compile="default", optimizer="fused",
                        params={"seq": 384})  # fmt: skip
    assert TuneConfig.from_dict(config.to_dict()) == config
    assert config.label() == "bf16 b64 compile=default fused"
    with pytest.raises(UserError, match="unknown keys"):
        TuneConfig.from_dict({**config.to_dict(), "fp8": True})
    trial = {"id": 0, "ok": True, "axis": "baseline", "label": config.label(), "config": config.to_dict(),
             "samples_per_s": 100.0, "spread": 0.01, "peak_memory_bytes": 2**20, "mfu": None,
             "gain": 1.0, "numerics": "ok"}  # fmt: skip
    report = TuneReport(target="t:target", name="t", device={"device": "cpu"}, options={},
                        trials=[trial], baseline=0, best=0)  # fmt: skip
    for name in ("best.toml", "best.json"):
        write_best(tmp_path / name, report)
        assert read_best(str(tmp_path / name)) == config
    assert table_rows(report)[0][:4] == ["0*", "baseline", config.label(), "100.0"]
    # tune's MFU uses the one table of peaks (telemetry/peaks.py, datasheet values)
    assert peak_tflops("NVIDIA H200") == 989.5
    assert peak_tflops("NVIDIA H100 NVL") == 835.5
    assert peak_tflops("NVIDIA GH200 480GB") == 989.5
    assert peak_tflops("cpu") is None


def test_load_target_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not MODULE:ATTR or FILE\.py:ATTR"):
        load_target("examples/tune_tiny/target.py")
    with pytest.raises(UserError, match="is not a file"):
        load_target(f"{tmp_path}/missing.py:target")
    (tmp_path / "bad.py").write_text("class NotATarget:\n    pass\nthing = NotATarget()\n")
    with pytest.raises(UserError, match=r"has no default_config\(\), build\(\)"):
        load_target(f"{tmp_path}/bad.py:thing")
    with pytest.raises(UserError, match="has no attribute 'nope'"):
        load_target(f"{tmp_path}/bad.py:nope")
