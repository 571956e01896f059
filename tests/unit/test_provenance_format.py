"""Provenance's text: URLs redacted, diffs in a stable order, damaged parts tolerated, the
probe timeout read from the environment (real git and interpreters:
tests/integration/test_provenance.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from acceptrun.capture import provenance
from acceptrun.capture.provenance import Change


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("https://u:p@h/x", "https://<redacted>@h/x", id="user-password"),
        pytest.param("https://ghp_tok@github.com/o/r", "https://<redacted>@github.com/o/r", id="token"),
        pytest.param("s3://b/k a=redis://:pw@h:6379", "s3://b/k a=redis://<redacted>@h:6379", id="inside"),
        pytest.param("git@github.com:o/r.git", "git@github.com:o/r.git", id="scp-style-kept"),
        pytest.param("https://h/x@y", "https://h/x@y", id="at-in-path-kept"),
    ],
)  # fmt: skip
def test_redact_url(text: str, expected: str) -> None:
    assert provenance.redact_url(text) == expected


def test_diff_names_python_gpu_and_absent_changes_in_a_stable_order() -> None:
    a: dict[str, Any] = {
        "schema": 1,
        "captured_at": "2025-01-01T00:00:00Z",
        "python": {"version": "3.11.7", "implementation": "CPython", "executable": "/p"},
        "packages": {"count": 1, "list": {"torch": "2.12.0"}},
        "gpus": {"count": 1, "devices": [{"index": 0, "name": "NVIDIA H100"}]},
        "torch": {"absent": True, "reason": "torch is not installed"},
        "hashes": {"all": "xxh3_128:1"},
    }
    b = copy.deepcopy(a)
    b["captured_at"] = "2025-06-01T00:00:00Z"
    b["hashes"] = {"all": "xxh3_128:2"}
    b["python"]["version"] = "3.12.1"
    b["packages"]["list"] = {"torch": "2.13.0", "numpy": "2.0.1"}
    b["gpus"]["devices"].append({"index": 1, "name": "NVIDIA H100"})
    b["torch"] = {"version": "2.13.0"}

    changes = provenance.diff(a, b)

    assert changes == [
        Change("gpus.devices[1].index", None, 1),
        Change("gpus.devices[1].name", None, "NVIDIA H100"),
        Change("packages.list.numpy", None, "2.0.1"),
        Change("packages.list.torch", "2.12.0", "2.13.0"),
        Change("python.version", "3.11.7", "3.12.1"),
        Change("torch.absent", True, None),
        Change("torch.reason", "torch is not installed", None),
        Change("torch.version", None, "2.13.0"),
    ]
    assert (
        provenance.format_diff(changes).splitlines()[3] == "packages.list.torch: 2.12.0 -> 2.13.0"
    )
    assert provenance.format_diff(changes).splitlines()[5] == "torch.absent: true -> (none)"
    assert provenance.format_diff([]) == "no differences"


def test_format_provenance_tolerates_missing_and_damaged_parts() -> None:
    text = provenance.format_provenance({"schema": 1, "os": {"system": "Linux"}})
    assert "os        unreadable (KeyError: 'release')" in text
    assert "gpus      absent (not recorded)" in text


def test_probe_timeout_comes_from_the_environment_or_says_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from acceptrun.capture.provenance import ENV_PROBE_TIMEOUT, PROBE_TIMEOUT, probe_timeout
    from acceptrun.errors import UserError

    monkeypatch.delenv(ENV_PROBE_TIMEOUT, raising=False)
    assert probe_timeout() == PROBE_TIMEOUT == 180.0
    monkeypatch.setenv(ENV_PROBE_TIMEOUT, "600")
    assert probe_timeout() == 600.0
    for bad in ("soon", "0", "-5", "nan"):
        monkeypatch.setenv(ENV_PROBE_TIMEOUT, bad)
        with pytest.raises(UserError, match=rf"ACCEPTRUN_PROBE_TIMEOUT is '{bad}'; set it to"):
            probe_timeout()
