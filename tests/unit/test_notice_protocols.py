"""Each provider's preemption notice protocol, read from a loopback server speaking it (the
run that a notice ends: tests/integration/test_preemption_notice.py)."""

from __future__ import annotations

import pytest
from tests.metadata_server import NOTICE_S, MetadataServer

from acceptrun.supervisor.notice import look


@pytest.mark.parametrize(("provider", "action", "ahead"), [
    ("aws", "terminate", NOTICE_S), ("gcp", "preempt", 30.0), ("azure", "preempt", 30.0),
])  # fmt: skip
def test_no_notice_then_the_notice_with_its_deadline(
    provider: str, action: str, ahead: float
) -> None:
    with MetadataServer() as md:
        assert look(provider, md.url) is None
        md.give_notice()
        notice = look(provider, md.url)
        assert notice is not None and (notice.provider, notice.action) == (provider, action)
        assert notice.deadline is not None
        # AWS and Azure give the time to the second (their formats): within a second of it.
        assert abs(notice.deadline - (md.noticed_at + ahead)) <= 1.5  # type: ignore[operator]
        assert md.looks == 2 and md.refused == 0  # each look sent the provider's headers


def test_a_metadata_service_that_is_not_there_raises_oserror() -> None:
    with MetadataServer() as md:
        url = md.url
    with pytest.raises(OSError):
        look("aws", url)  # nothing listens any more: refused at once, never a hang
    with pytest.raises(OSError):
        look("gcp", "http://127.0.0.1:9")  # the discard port: refused
