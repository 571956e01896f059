"""A process reads the secret-shape rules from the cache the first one wrote, without
importing detect-secrets, and hides the same credentials (secret_shapes: the cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys
from acceptrun._util.redact import redact_text
out = redact_text("push failed: 401 for ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE.", secrets=())
print(out)
print("detect_secrets" in sys.modules)
"""


def _child(cache: Path) -> list[str]:
    env = {**os.environ, "ACCEPTRUN_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_second_process_reads_the_rules_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _child(cache)
    assert first == ["push failed: 401 for <redacted>.", "True"]  # read live, then written
    assert (cache / "secret-shapes.json").is_file()
    second = _child(cache)
    assert second == ["push failed: 401 for <redacted>.", "False"]  # from the cache
    (cache / "secret-shapes.json").write_text("{}")  # spoiled: read live again, rewritten
    assert _child(cache)[1] == "True"
    assert _child(cache)[1] == "False"
