"""Secrets known by their shape are hidden in every form they are quoted in; what is not a
secret (metavars, placeholders, key names, paths, digests, ids) is never hidden; a
variable named by a secret-naming spec field keeps its name and loses its value.

Generative where the surface is declared: every shape of tests/secret_shapes.py in four
quotings, every rule of the rule set taken or listed, every command's ``--help`` from the
CLI parser, every section's unknown-key error from the spec declaration.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import secrets
import threading
import typing
import uuid
from collections.abc import Callable, Iterator

import pytest

from acceptrun._util import redact
from acceptrun._util.redact import REDACTED, redact_obj, redact_record, redact_text
from acceptrun._util.secret_shapes import SUPPLEMENTS, hide_shapes, left_out, taken
from acceptrun.cli.main import build_parser
from acceptrun.errors import SpecError
from acceptrun.record.workspace import new_run_id
from acceptrun.spec.fields import fields_of
from acceptrun.spec.model import SECRET_ENV_FIELDS, RunSpec, parse_spec
from campaign import tally
from secret_shapes import SHAPES

# How a workload quotes what it holds: bare, inside a longer line, as JSON, and as the
# repr of an exception's arguments on a traceback's last line.
QUOTINGS: dict[str, Callable[[str], str]] = {
    "alone": lambda t: t,
    "in a line": lambda t: f"ERROR upload failed ({t}) after 3 tries",
    "json": json.dumps,
    "traceback repr": lambda t: f"ValueError: {('login failed', t)!r}",
}


@pytest.mark.parametrize("quoting", list(QUOTINGS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_shape_is_hidden_however_it_is_quoted(shape: typing.Any, quoting: str) -> None:
    text = QUOTINGS[quoting](shape.text)
    out = redact_text(text, secrets=())
    tally("secret shapes", tried=1, secrets=int(shape.needle in out))
    assert shape.needle not in out, out
    assert REDACTED in out, out
    if quoting == "in a line":  # the evidence around the secret stays
        assert out.startswith("ERROR upload failed (") and out.endswith(") after 3 tries")
    assert redact_text(out, secrets=()) == out  # idempotent: a record read and rewritten


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_shape_in_a_record_string_is_hidden(shape: typing.Any) -> None:
    event = {"kind": "attempt_failed", "t": 1.0, "cause": f"Traceback ...\n{shape.text}\n"}
    assert shape.needle not in json.dumps(redact_record(event))


def _rule_set() -> list[tuple[str, str]]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    return [
        (family, rx.pattern)
        for family, plugin in sorted(get_mapping_from_secret_type_to_class().items())
        for rx in getattr(plugin, "denylist", None) or ()
    ]


def test_every_rule_of_the_rule_set_is_taken_or_listed_with_its_reason() -> None:
    rules = _rule_set()
    supplements = {s.family for s in SUPPLEMENTS}
    from_rule_set = [family for family, _ in taken() if family not in supplements]
    out = [(family, reason) for family, _, reason in left_out()]
    assert len(from_rule_set) + len(out) == len(rules)
    # detect-secrets 1.5.0 has 46 regex rules; a new release changes these two lines: read
    # its new rules, see how each was translated (taken()) and why one was left out.
    assert len(from_rule_set) == 45, taken()
    assert out == [
        (
            "Public IP (ipv4)",
            "an address, not a credential (and a four-part version, 1.2.10.4, reads the same)",
        )
    ]
    assert len(taken()) == len(from_rule_set) + len(SUPPLEMENTS)


@pytest.mark.parametrize(
    "text,hidden",
    [
        # (?:(?<=\W)|(?<=^)) -> the character before is consumed: a word start only
        pytest.param("cloudant_password = '" + "ab12" * 16 + "'", True, id="lookbehind-start"),
        pytest.param(" ibm_cloud_iam_key = " + "k" * 44, True, id="lookbehind-space"),
        pytest.param("xibm_cloud_iam_key = " + "k" * 44, False, id="lookbehind-in-word"),
        # (?![a-f0-9]) at the end of the group -> the character after the group is checked
        pytest.param("cos_secret_access_key='" + "ab" * 24 + "'", True, id="not-next-48"),
        pytest.param("cos_secret_access_key='" + "ab" * 24 + "a'", False, id="not-next-49"),
        # (?!\w) at the end of the rule -> the character after the match is checked
        pytest.param("ci glptt-" + "Ab1_" * 10 + " ok", True, id="not-next-word-end"),
        pytest.param("ci glptt-" + "Ab1_" * 10 + "Z ok", False, id="not-next-word-longer"),
        # {50,1024} over RE2's 1000 -> {50}{0,974}
        pytest.param("glagent-" + "a" * 1024 + " ok", True, id="repeat-1024"),
        pytest.param("glagent-" + "a" * 49 + " ok", False, id="repeat-short"),
    ],
)  # fmt: skip
def test_translated_rules_keep_their_meaning(text: str, hidden: bool) -> None:
    out = hide_shapes(text)
    assert (out != text) is hidden, out


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("digest 9F86D081884C7D65ACCA0123456789ABCDEF0123456789ABCDEF", id="acca-in-hex"),
        pytest.param("TASKabcdefghijklmnopqrstuvwxyz012345 done", id="sk-in-a-word"),
        pytest.param("run 12345678901234:abcdefghijklmnopqrstuvwxyz012345678", id="digits-in-a-run"),
    ],
)  # fmt: skip
def test_a_shape_inside_a_longer_word_is_not_hidden(text: str) -> None:
    assert hide_shapes(text) == text


def test_shapes_are_hidden_among_non_ascii_and_undecodable_text() -> None:
    # a workload's stderr read with surrogateescape: its bytes come back as they were
    text = "données\udcff é ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE ü日本"
    assert redact_text(text, secrets=()) == "données\udcff é <redacted> ü日本"


def test_a_command_line_keeps_paths_and_hides_values() -> None:
    argv = ["scp", "--keyfile", "/home/u/.ssh/id", "--password-file", "p.txt", "--token", "t0k3n99"]
    assert redact.redact_argv(argv, secrets=()) == [*argv[:-1], REDACTED]


def test_a_rule_hides_its_group_and_the_rest_of_the_token() -> None:
    jwt = next(s for s in SHAPES if s.family == "jwt")
    signature = jwt.text.rsplit(".", 1)[1]
    assert signature not in hide_shapes(f"jwt={jwt.text}.")  # the rule's lazy tail, widened
    assert hide_shapes("aws_key = 'AKIAQ3EGRQ7Z5XN2KTWB'") == "aws_key = '<redacted>'"
    aws = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8vT4nB2k"
    assert hide_shapes(f'aws_password = "{aws}"') == f'aws_password = "{REDACTED}"'


def test_without_shapes_skips_only_the_shapes_and_only_in_its_context() -> None:
    token = "ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE"
    text = f"{token} --api-key abc123def"
    seen: list[str] = []
    redact.forget_learned()  # another test of this worker may have taught it the token
    with redact.without_shapes():
        inside = redact_text(text, secrets=())
        worker = threading.Thread(target=lambda: seen.append(redact_text(text, secrets=())))
        worker.start()
        worker.join()
    assert inside == f"{token} --api-key <redacted>"  # names still hidden
    assert seen == ["<redacted> --api-key <redacted>"]  # another thread: shapes too
    assert redact_text(text, secrets=()) == "<redacted> --api-key <redacted>"


# ---- learned secrets keep their name ---------------------------------------------------------

NOTIFY = (
    '[notify]\nemail_to = ["oncall@example.com"]\nemail_from = "run@example.com"\n'
    'smtp_host = "smtp.example.com"\nsmtp_user_env = "SMTP_USER"\n'
    'smtp_password_env = "{name}"\n'
)


@pytest.mark.parametrize("notify", [True, False], ids=["with-notify", "without-notify"])
def test_a_secret_variable_keeps_its_name_and_loses_its_value(notify: bool) -> None:
    spec = 'name = "t"\ncommand = ["python", "t.py"]\n[env]\nDB_PASSWORD = "hunter2xyz"\n'
    try:
        parse_spec(spec + (NOTIFY.format(name="DB_PASSWORD") if notify else ""))
        said = redact_text("connect failed: DB_PASSWORD=hunter2xyz (user hunter2xyz)")
        assert said == "connect failed: DB_PASSWORD=<redacted> (user <redacted>)", said
        kept = {"notify": {"smtp_password_env": "DB_PASSWORD"}}
        assert redact_obj(kept) == kept  # the field names a variable: its name is no secret
    finally:
        redact.forget_learned()


def test_the_named_variable_is_learned_from_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A name that does not look secret: only the declaration says its value is one.
    monkeypatch.setenv("MAIL_PW_VAR", "s3cret-mail-99")
    assert ("notify", "smtp_password_env") in SECRET_ENV_FIELDS
    try:
        parse_spec('name = "t"\ncommand = ["python", "t.py"]\n' + NOTIFY.format(name="MAIL_PW_VAR"))
        said = redact_text("login as MAIL_PW_VAR=s3cret-mail-99 refused", secrets=())
        assert said == "login as MAIL_PW_VAR=<redacted> refused", said
    finally:
        redact.forget_learned()


# ---- nothing that is not a secret is hidden ----------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = dict(_parsers(build_parser(), ("acceptrun",)))


@pytest.mark.parametrize("command", list(PARSERS))
def test_every_commands_help_comes_out_unchanged(command: str) -> None:
    # metavars (--token TOKEN, --api-key KEY), option names, paths, examples
    text = PARSERS[command].format_help()
    out = redact_text(text, secrets=())
    tally("help texts through the redactor", tried=1, secrets=int(out != text))
    assert out == text


def _sections() -> list[str]:
    hints = typing.get_type_hints(RunSpec)
    return [name for name in fields_of(RunSpec) if dataclasses.is_dataclass(hints[name])]


@pytest.mark.parametrize("section", ["", *_sections()])
def test_every_unknown_key_error_comes_out_unchanged(section: str) -> None:
    # "known keys: partition, account, ...": "keys" is a plural noun, not a secret's name
    table = f"[{section}]\n" if section else ""
    with pytest.raises(SpecError) as caught:
        parse_spec(f'name = "t"\ncommand = ["python", "t.py"]\n{table}zzqx = 1\n')
    message = str(caught.value)
    assert "known keys" in message
    assert redact_text(message, secrets=()) == message


def test_placeholders_paths_and_names_are_kept() -> None:
    texts = [
        "usage: acceptrun ui [--token TOKEN] [--api-key KEY] [--password-env NAME]",
        "set HF_TOKEN=$HF_TOKEN or token=${HF_TOKEN}; api_key=<token>; password=***",
        "Authorization: Bearer <token>  Authorization: token TOKEN",
        "scp --keyfile ~/.ssh/id_ed25519 key_path=/etc/k.pem secrets_dir=/run/s tokenfile=t",
        "known keys: partition, account, time; TOKENS=512",
        "token embeddings, basic blocks, bearer of bad news",
        "smtp_password_env = DB_PASSWORD",
    ]
    for text in texts:
        assert redact_text(text, secrets=()) == text


def _record_values() -> dict[str, str]:
    blob = secrets.token_bytes(64)
    return {
        "sha256": hashlib.sha256(blob).hexdigest(),
        "sha256_tagged": "sha256:" + hashlib.sha256(blob[1:]).hexdigest(),
        "xxhash": "xxh3_128:" + hashlib.blake2b(blob, digest_size=16).hexdigest(),
        "git": hashlib.sha1(blob).hexdigest(),
        "uuid": str(uuid.uuid4()),
        "uuid_hex": uuid.uuid4().hex,
        "upper_digest": hashlib.md5(blob).hexdigest().upper(),
        "run_id": new_run_id("charlm-" + secrets.token_hex(3)),
        "version": "torch==2.5.1+cu124",
        "address": "10.1.2.3:29500 and 8.8.8.8",
    }


@pytest.mark.parametrize("round_", range(20))
def test_digests_ids_and_versions_in_a_record_are_kept(round_: int) -> None:
    values = _record_values()  # random each round: no digest happens to be kept by luck
    record = {"kind": "checkpoint", "step": round_, **values, "note": " ".join(values.values())}
    assert redact_record(record) == record
    line = json.dumps(record)
    assert redact_text(line, secrets=()) == line


def test_loading_the_rule_set_leaves_the_scripts_warnings_shown(
    tmp_path: typing.Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # detect-secrets' logger captures warnings into logging when it is made: a script's
    # warnings then went nowhere once the redactor had loaded its rules (a real run's
    # stderr: tests/integration/test_accelerate_upstream_loop.py). An empty cache
    # directory: the rules are read from detect-secrets, not from the cached translation.
    import logging
    import warnings

    from acceptrun._util import secret_shapes

    before = warnings.showwarning
    secret_shapes.keeping_warnings(lambda: logging.captureWarnings(True))
    assert warnings.showwarning is before
    monkeypatch.setenv(secret_shapes.ENV_CACHE_DIR, str(tmp_path))
    secret_shapes._scanner.cache_clear()  # load the rules again, here
    assert hide_shapes("token ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE") == "token <redacted>"
    assert warnings.showwarning is before
