"""tools/proc_cpu.py: the hook logs real child interpreters' CPU (kinds:
tests/unit/test_proc_cpu_kinds.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import proc_cpu  # noqa: E402


def test_an_installed_hook_logs_each_process_at_exit_and_uninstall_removes_it(
    tmp_path: Path,
) -> None:
    site_dir, logs = tmp_path / "site", tmp_path / "logs"
    site_dir.mkdir()
    pth = proc_cpu.install(logs, site_dir=site_dir)
    # site.addsitedir runs the folder's .pth files, as start-up does for site-packages; twice,
    # as start-up does in a venv whose lib64 links to lib: the process is still logged once.
    add = f"site.addsitedir({str(site_dir)!r})"
    code = f"import site; {add}; {add}; import json; sum(range(10**6))"
    script = tmp_path / "train.py"
    script.write_text(code)
    env = {"PATH": "/usr/bin:/bin", "PYTEST_CURRENT_TEST": "t.py::test_x (call)"}
    subprocess.run([sys.executable, str(script), "--lr", "1"], check=True, env=env)
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"})
    docs = sorted(proc_cpu.load(logs), key=lambda d: d["argv"][0])
    assert [d["argv"] for d in docs] == [["-c"], [str(script), "--lr", "1"]]
    assert [proc_cpu.kind(d) for d in docs] == ["python -c (xdist workers among them)",
                                                "script train.py"]  # fmt: skip
    assert [d["test"] for d in docs] == ["", "t.py::test_x (call)"]
    assert all(d["cpu"] > 0 and d["wall"] > 0 and d["torch"] is False for d in docs)
    assert proc_cpu.uninstall(site_dir) == pth and not pth.exists()
