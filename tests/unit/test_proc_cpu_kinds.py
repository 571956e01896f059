"""tools/proc_cpu.py: what kind of process each logged argv was (the hook:
tests/integration/test_proc_cpu_hook.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import proc_cpu  # noqa: E402


def test_kinds_of_process() -> None:
    def kind(*argv: str) -> str:
        return proc_cpu.kind({"argv": list(argv)})

    main = "/x/src/acceptrun/__main__.py"
    assert kind(main, "--workspace", "run", "resume", "RUN") == "acceptrun resume"
    assert kind(main, "--help") == "acceptrun (help or a bad command line)"
    assert kind("/venv/bin/acceptrun", "--debug", "ls") == "acceptrun ls"
    assert kind("/venv/lib/torch/distributed/run.py", "--nproc-per-node", "2") == "torchrun agent"
    assert kind("/x/src/acceptrun/capture/_probe.py", "--cache", "c") == "provenance probe"
    assert kind("/venv/lib/pytest/__main__.py", "-q") == "pytest"
    assert kind("/tmp/pytest-of-root/p0/train.py") == "script train.py"
