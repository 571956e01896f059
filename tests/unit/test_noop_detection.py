"""No silent no-ops, without a run: which keys a script uses, an acceptance metric its
framework logs once, max_downtime on a run that serves nothing, registered outputs found
statically (the warnings and refusals of real runs: tests/integration/test_noop_warnings.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from acceptrun.spec.model import parse_spec
from acceptrun.workload.usage import BLACK_BOX, CLIENT, UNKNOWN, detect_usage


def _spec(tmp: Path, command: str | list[str]) -> object:
    cmd = json.dumps(command)
    return parse_spec(f'name = "u"\ncommand = {cmd}\n', base_dir=tmp)


@pytest.mark.parametrize(
    ("files", "command", "kind"),
    [
        pytest.param({"t.py": "import acceptrun\n"}, [sys.executable, "t.py"], CLIENT, id="script"),
        pytest.param(
            {"t.py": "from acceptrun.integrations import x\n"},
            ["python", "-u", "t.py"],
            CLIENT,
            id="integrations",
        ),
        pytest.param(
            {"t.py": "import os, torch, acceptrun as ar\n"}, ["python", "t.py"], CLIENT, id="list"
        ),
        pytest.param({"t.py": "import torch\n"}, ["python", "t.py"], BLACK_BOX, id="black-box"),
        pytest.param(
            {"pkg/train.py": "from acceptrun import init\n"},
            ["python", "-m", "pkg.train"],
            CLIENT,
            id="module",
        ),
        pytest.param(
            {"t.py": "import acceptrun\n"},
            ["torchrun", "--nproc-per-node", "2", "t.py"],
            CLIENT,
            id="torchrun",
        ),
        pytest.param({}, "python t.py && echo done", UNKNOWN, id="shell-string"),
        pytest.param({}, ["/bin/true"], UNKNOWN, id="binary"),
        pytest.param({}, ["python", "-m", "http.server"], UNKNOWN, id="installed-module"),
        pytest.param({}, ["python", "-c", "import acceptrun"], UNKNOWN, id="inline"),
    ],
)
def test_detect_usage(tmp_path: Path, files: dict[str, str], command: object, kind: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    usage = detect_usage(_spec(tmp_path, command))  # type: ignore[arg-type]
    assert usage.kind == kind, usage.reason


def test_an_acceptance_metric_of_one_attempt_is_refused_for_its_framework(
    tmp_path: Path,
) -> None:
    from acceptrun.spec.model import parse_spec
    from acceptrun.workload.usage import spec_findings

    text = 'name = "u"\ncommand = ["python", "t.py"]\n[acceptance.metrics]\n'
    text += 'train_loss = "<= 3"\neval_loss = "<= 3"\n'
    spec = parse_spec(text, base_dir=tmp_path)
    (tmp_path / "t.py").write_text("from acceptrun.integrations.transformers import X\n")
    usage = detect_usage(spec)
    assert usage.integrations == {"transformers"}
    (refused,) = [f for f in spec_findings(spec, usage) if f.level == "error"]
    assert refused.key == "acceptance.metrics.train_loss", refused
    assert "one attempt" in refused.message and "eval_loss" in refused.fix, refused
    # A script of its own computes its own train_loss: nothing to refuse.
    (tmp_path / "t.py").write_text("import acceptrun\n")
    assert not [f for f in spec_findings(spec, detect_usage(spec)) if f.level == "error"]


def test_max_downtime_on_a_run_that_serves_nothing_is_a_warning(tmp_path: Path) -> None:
    from acceptrun.workload.usage import spec_findings

    (tmp_path / "t.py").write_text("print('hi')\n")
    text = 'name = "u"\ncommand = ["python", "t.py"]\n[acceptance]\nmax_downtime = "30s"\n'
    spec = parse_spec(text, base_dir=tmp_path)
    (found,) = [f for f in spec_findings(spec, detect_usage(spec))
                if f.key == "acceptance.max_downtime"]  # fmt: skip
    assert found.level == "warning" and "30 s has no effect" in found.message, found
    served = text + '[serving]\nurl = "http://127.0.0.1:1/x"\nrequests = 4\n'
    served += 'ready_url = "http://127.0.0.1:1/health"\nrate = 10\n'
    spec = parse_spec(served, base_dir=tmp_path)
    assert not [f for f in spec_findings(spec, detect_usage(spec))
                if f.key == "acceptance.max_downtime"]  # fmt: skip


def test_statically_registered_outputs_are_found(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(
        'import acceptrun\nrun.output("model", p)\nrun.output(name="x", path=q)\n'
    )
    usage = detect_usage(_spec(tmp_path, ["python", "t.py"]))  # type: ignore[arg-type]
    assert usage.registers == {"model", "x"}
