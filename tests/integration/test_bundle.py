"""``acceptrun bundle`` of a real failed run with planted secrets: the archive is opened,
every file checked against its manifest's sha256, nothing missing or extra, and no
planted secret anywhere in it (with and without ``--include-logs``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.redact import forget_learned
from acceptrun.cli.main import main
from acceptrun.run.launch import LaunchResult, launch
from conftest import PYTHON, toml_str

TOKEN = "hf_PlantedBundleToken4242"
PASSWORD = "planted-pw-9311"
URL = f"https://alice:{PASSWORD}@data.example.com/shards"
# A [notify] webhook (a secret field: its frozen spec leaves it out) that the workload
# also prints, as a script that echoes its configuration does. Port 9 on loopback refuses
# the delivery at once; it is recorded as failed and the run goes on.
HOOK_SECRET = "PlantedHookPath5150"
HOOK = f"http://127.0.0.1:9/hooks/{HOOK_SECRET}"
SECRETS = (TOKEN, PASSWORD, HOOK_SECRET)

# Three steps with a checkpoint each, then a crash whose message and stderr carry the
# token and the URL with credentials (as a careless loader prints them).
WORKLOAD = """
import os, sys
import numpy as np
import acceptrun

weights = np.zeros((8, 8), dtype=np.float32)
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 3):
    run.log(step, loss=1.0 / (step + 1))
    run.checkpoint(step, block=True)
print("alerts go to", os.environ["ALERTS"], file=sys.stderr)
print("token", os.environ["HF_TOKEN"], "from", os.environ["DATA_URL"], file=sys.stderr)
print("stdout also says", os.environ["HF_TOKEN"])
raise RuntimeError(f"the mirror refused {os.environ['DATA_URL']} with token {os.environ['HF_TOKEN']}")
"""


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> LaunchResult:
    root = tmp_path_factory.mktemp("bundle")
    job = root / "job"
    job.mkdir()
    (job / "work.py").write_text(WORKLOAD)
    (job / "spec.toml").write_text(
        f'name = "leaky"\ncommand = [{toml_str(PYTHON)}, "work.py"]\n'
        '[limits]\nmax_restarts = 0\ngrace_period = "2s"\n'
        f"[env]\nHF_TOKEN = {toml_str(TOKEN)}\nDATA_URL = {toml_str(URL)}\n"
        f"ALERTS = {toml_str(HOOK)}\n"
        "[cost]\nprice_per_hour = 3600\n"
        f'[notify]\nwebhook = {toml_str(HOOK)}\nretries = 1\nclose_wait = "1s"\n'
    )
    saved = dict(os.environ)
    try:
        result = launch(job / "spec.toml", workspace=root / ".acceptrun", echo=False, inject=[])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return result


def _bundle(failed: LaunchResult, out: Path, *args: str) -> dict[str, bytes]:
    forget_learned()  # the bundle must learn the run's secrets from its own frozen spec
    record = failed.record
    ws = record.path.parent.parent
    assert main(["--workspace", str(ws), "bundle", record.run_id, "-o", str(out), *args]) == 0
    with tarfile.open(out, "r:gz") as tar:
        members = tar.getmembers()
        assert all(m.isfile() for m in members)
        files = {}
        for m in members:
            top, _, name = m.name.partition("/")
            assert top == record.run_id and ".." not in name.split("/")
            f = tar.extractfile(m)
            assert f is not None
            files[name] = f.read()
    return files


def _verified(files: dict[str, bytes]) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(files["MANIFEST.json"])
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(files) == set(listed) | {"README.txt", "MANIFEST.json", "SHA256SUMS"}
    for name, entry in listed.items():
        assert hashlib.sha256(files[name]).hexdigest() == entry["sha256"], name
        assert len(files[name]) == entry["bytes"], name
    sums = dict(reversed(line.split("  ", 1)) for line in files["SHA256SUMS"].decode().splitlines())
    assert sums == {n: e["sha256"] for n, e in listed.items()}
    for name, data in files.items():
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {name}"
    return manifest


def test_the_planted_secrets_are_really_in_the_record(failed: LaunchResult) -> None:
    assert failed.exit_code != 0
    err = (failed.record.attempt_dir(1) / "stderr.log").read_text()
    assert TOKEN in err and PASSWORD in err  # the workload's own log is kept whole
    assert HOOK_SECRET in err


def test_a_bundle_holds_the_record_redacted_and_verified(
    failed: LaunchResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "leaky.tar.gz"
    files = _bundle(failed, out)
    manifest = _verified(files)
    assert f"wrote {out}" in capsys.readouterr().out
    for name in ("spec.toml", "run.json", "provenance.json", "events.jsonl", "verdict.json",
                 "ledger.json", "telemetry.jsonl", "gpu_timeline.jsonl",
                 "attempts/1/exit.json", "attempts/1/stderr.tail.log"):  # fmt: skip
        assert name in files, name
    exit_record = json.loads(files["attempts/1/exit.json"])
    assert exit_record["class"] == "failed"
    tail = files["attempts/1/stderr.tail.log"].decode()
    assert "RuntimeError: the mirror refused https://<redacted>@data.example.com" in tail
    assert "<redacted>" in files["spec.toml"].decode()
    ckpts = [n for n in files if n.startswith("checkpoints/")]
    assert ckpts and all(n.endswith("/MANIFEST.json") for n in ckpts)  # manifests, no tensors
    assert "attempts/1/stdout.log" not in files and "attempts/1/stderr.log" not in files
    assert any("--include-logs" in x for x in manifest["left_out"])
    readme = files["README.txt"].decode()
    assert "What it leaves out" in readme and "checkpoint tensors" in readme
    assert not manifest["include_logs"]
    ledger = json.loads(files["ledger.json"])
    assert ledger["compute"]["attempts"][0]["responsibility"] == "unknown"


def test_include_logs_adds_the_whole_logs_redacted(failed: LaunchResult, tmp_path: Path) -> None:
    files = _bundle(failed, tmp_path / "logs.tar.gz", "--include-logs")
    manifest = _verified(files)
    assert manifest["include_logs"]
    assert "stdout also says <redacted>" in files["attempts/1/stdout.log"].decode()
    err = files["attempts/1/stderr.log"].decode()
    assert "token <redacted> from https://<redacted>@data.example.com/shards" in err


def test_an_existing_file_is_kept_without_force(
    failed: LaunchResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken.tar.gz"
    out.write_bytes(b"a good file")
    ws = str(failed.record.path.parent.parent)
    rid = failed.record.run_id
    assert main(["--workspace", ws, "bundle", rid, "-o", str(out)]) != 0
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b"a good file"
    assert main(["--workspace", ws, "bundle", rid, "-o", str(out), "--force"]) == 0
    with tarfile.open(fileobj=io.BytesIO(out.read_bytes()), mode="r:gz") as tar:
        assert any(m.name.endswith("/MANIFEST.json") for m in tar.getmembers())
    inside = failed.record.path / "b.tar.gz"
    assert main(["--workspace", ws, "bundle", rid, "-o", str(inside)]) != 0
    assert "inside the run's record" in capsys.readouterr().err and not inside.exists()


def test_a_damaged_record_still_bundles_and_says_what_was_damaged(
    failed: LaunchResult, tmp_path: Path
) -> None:
    import shutil

    ws = tmp_path / ".acceptrun"
    shutil.copytree(failed.record.path.parent.parent, ws)
    run_dir = ws / "runs" / failed.record.run_id
    (run_dir / "verdict.json").write_bytes(b"[" * 100_000)  # too deep to parse
    with (run_dir / "events.jsonl").open("ab") as f:  # a line past the readers' 16 MiB limit
        f.write(b'{"kind": "step", "pad": "' + b"x" * (17 << 20) + b'"}\n')
    out = tmp_path / "damaged.tar.gz"
    forget_learned()
    assert main(["--workspace", str(ws), "bundle", failed.record.run_id, "-o", str(out)]) == 0
    with tarfile.open(out, "r:gz") as tar:
        files = {
            m.name.partition("/")[2]: f.read()
            for m in tar.getmembers()
            if (f := tar.extractfile(m)) is not None
        }
    _verified(files)
    assert files["verdict.json"] == b"[" * 100_000  # copied as it is
    assert "verdict.json: the verdict" in files["README.txt"].decode()
    assert "DAMAGED, copied as it is" in files["README.txt"].decode()
    events = files["events.jsonl"].decode()
    long_line = len(b'{"kind": "step", "pad": "') + (17 << 20) + len(b'"}')
    assert f"[acceptrun bundle: a line of {long_line} bytes left out]" in events
    assert '"kind":"attempt_exit"' in events  # the lines around it are kept
