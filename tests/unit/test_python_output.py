"""Who gives the job PYTHONUNBUFFERED: the spec's [env], the spec's switch, the caller, us."""

from __future__ import annotations

import pytest

from acceptrun.supervisor.process import UNBUFFERED, python_output


@pytest.mark.parametrize(
    ("inherited", "spec_env", "enabled", "value", "by"),
    [
        (None, {}, True, "1", "acceptrun"),
        ("", {}, True, "1", "acceptrun"),  # empty is off for Python: set it
        ("yes", {}, True, "yes", "inherited"),  # any non-empty value is already on
        (None, {UNBUFFERED: ""}, True, "", "env"),  # the spec's word is kept, even off
        ("1", {UNBUFFERED: "0"}, False, "0", "env"),
        (None, {}, False, None, "off"),
        ("1", {}, False, "1", "off"),  # off: what the caller had is left as it was
    ],
)  # fmt: skip
def test_python_output_says_who_decided(
    inherited: str | None, spec_env: dict[str, str], enabled: bool, value: str | None, by: str
) -> None:
    env = {"PATH": "/usr/bin"} | ({} if inherited is None else {UNBUFFERED: inherited})
    assert python_output(env, spec_env, enabled) == by
    assert env.get(UNBUFFERED) == value and env["PATH"] == "/usr/bin"
