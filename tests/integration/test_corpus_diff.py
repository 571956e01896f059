"""``acceptrun diff`` compares every common step of two runs whose counter restarts.

Two runs of the same corpus shape (tests/corpus/shapes/) printed by corpus_replay.py:
the ImageNet example's ``Epoch: [e][ i/n]``, whose batch counter starts again each epoch,
and a tqdm bar that prints no epoch at all. On the composed axis the two runs have every
recorded step in common, the loss equal at each; the diff counts them all (it counted 10
of the ImageNet shape's steps while the counter's drops were silent).
"""

from __future__ import annotations

import json

import pytest
import tomli_w
from corpus_runs import command, load

from campaign import tally
from conftest import Project


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pytorch_imagenet", "tqdm_epoch_bar"])
def test_diff_of_two_runs_of_a_restarting_counter_compares_every_common_step(
    project: Project, name: str
) -> None:
    meta = load(name)
    want = len({step for _line, step, _loss in meta["truth"]})
    progress = tomli_w.dumps({"progress": meta["progress"]})
    for run in ("a", "b"):
        spec = project.spec(command=command(name, []), name=f"diff-{run}", extra=progress)
        proc = project.cli("run", str(spec), timeout=240)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    a, b = project.run_ids()
    proc = project.cli("diff", "--json", a, b)
    result = json.loads(proc.stdout)
    assert result["loss"]["common_steps"] == want, result["loss"]
    assert result["loss"]["only_a"] == result["loss"]["only_b"] == 0, result["loss"]
    assert result["loss"]["max_abs_diff"] == 0, result["loss"]
    text = project.cli("diff", a, b).stdout
    assert f"loss     {want} common steps, largest difference 0" in text, text
    tally("corpus diff", tried=4)
