"""A mirror url with credentials in it: its state file holds the url redacted, and a later
attempt's Mirror of the same url still finds the earlier uploads in it (nothing is sent
again), and the steps an earlier attempt left pending are still uploaded."""

from __future__ import annotations

import secrets
from pathlib import Path

from acceptrun._util.durable import read_json
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.mirror_remote import remote_steps
from builders import make_checkpoint

PASSWORD = "SEKRIT0MIRRORSTATE0rrrr"


def _url() -> str:
    # memory:// keeps the userinfo as part of the path, so uploads succeed in-process.
    return f"memory://user:{PASSWORD}@acceptrun-{secrets.token_hex(3)}/run"


def test_a_later_attempt_sees_the_earlier_uploads_of_a_url_with_a_password(
    tmp_path: Path,
) -> None:
    url, state_path = _url(), tmp_path / "mirror.json"
    ckpt = tmp_path / "ckpt"
    first = Mirror(url, state_path=state_path)
    first.upload(10, make_checkpoint(ckpt, 10))
    first.enqueue(20, make_checkpoint(ckpt, 20))  # the attempt dies before this one goes up
    first.close()
    doc = read_json(state_path)
    assert PASSWORD not in state_path.read_text()
    assert doc["url"] == url.replace(f"user:{PASSWORD}", "<redacted>")
    assert (doc["steps"]["10"]["state"], doc["steps"]["20"]["state"]) == ("ok", "pending")

    second = Mirror(url, state_path=state_path)
    before = second.status()
    assert before[10]["state"] == "ok" and before[10]["attempts"] == 1  # found, not forgotten
    assert before[20]["state"] == "pending"
    second.start()
    assert second.wait(timeout=10)
    second.close()
    after = second.status()
    assert after[10]["attempts"] == 1  # step 10 was not uploaded again
    assert after[20]["state"] == "ok"
    assert remote_steps(url) == [10, 20]
    assert PASSWORD not in state_path.read_text()


def test_another_url_does_not_inherit_the_state(tmp_path: Path) -> None:
    """The comparison is of redacted urls, but another bucket or path is still another url."""
    url, state_path = _url(), tmp_path / "mirror.json"
    Mirror(url, state_path=state_path).upload(1, make_checkpoint(tmp_path / "ckpt", 1))
    other = url.replace("/run", "/other")
    assert Mirror(other, state_path=state_path).status() == {}
