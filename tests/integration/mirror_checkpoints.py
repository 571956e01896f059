"""Checkpoints written by hand for the mirror tests of both tiers, and how to compare them."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic, write_json_atomic
from acceptrun._util.hashing import hash_bytes
from acceptrun.record.workspace import now_iso

Events = list[tuple[str, dict[str, Any]]]


def make_checkpoint(root: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    """A committed checkpoint in the store's format: files, MANIFEST.json last, LATEST."""
    if files is None:
        files = {
            "model.safetensors": secrets.token_bytes(64 * 1024),
            "optim/state.bin": secrets.token_bytes(4096),
            "meta.json": json.dumps({"step": step}).encode(),
        }
    step_dir = root / f"step-{step}"
    entries = {}
    for rel, data in files.items():
        (step_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (step_dir / rel).write_bytes(data)
        entries[rel] = {"size": len(data), "hash": hash_bytes(data)}
    manifest = {
        "kind": "acceptrun.checkpoint",
        "schema": 1,
        "step": step,
        "created_at": now_iso(),
        "algorithm": "xxh3_128",
        "files": entries,
        "total_bytes": sum(e["size"] for e in entries.values()),
        "metrics": {"loss": 1.0 / (step + 1)},
        "meta": {},
    }
    write_json_atomic(step_dir / "MANIFEST.json", manifest)
    write_atomic(root / "LATEST", f"step-{step}\n")
    return step_dir


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (directories implied)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def assert_same_checkpoint(local: Path, restored: Path) -> None:
    assert tree(restored) == tree(local)
