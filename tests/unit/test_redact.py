"""The redactor: every secret form is hidden, names that are not secrets are kept, and every
string field of the spec declaration, planted with a secret it accepts, reaches no export.

The forms are a table of (text, what must go, what must stay). The spec's string fields
are enumerated from RunSpec's declaration (``string_slots``): each gets a distinct marker
in a secret form whose value its declared rules accept (a field whose rules accept no free
text, such as choices or a condition, is skipped by that check, not by a list), then
``acceptrun export kubernetes`` / ``skypilot`` run in process on it and the Slurm script is
written the way ``acceptrun submit`` writes it; no file or output holds the marker, but
the Kubernetes Secret (the one place meant to carry ``[env]`` secrets, mode 0600).
"""

from __future__ import annotations

import dataclasses
import json
import stat
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from tests.campaign import tally

from acceptrun._util import redact
from acceptrun._util.durable import jsonl_line, write_atomic, write_json_atomic
from acceptrun._util.redact import REDACTED, redact_argv, redact_record, redact_text
from acceptrun.backends.kubernetes import KubernetesOptions, export_manifests
from acceptrun.backends.slurm import batch_script
from acceptrun.cli.main import main
from acceptrun.errors import SpecError, UserError
from acceptrun.record.workspace import Workspace
from acceptrun.spec.fields import check_value, fields_of, rules_of
from acceptrun.spec.model import RunSpec, load_spec, parse_spec

S = "SEKRIT0abc9"  # a planted value: never in any output


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"s3://user:{S}@bucket/ckpt", id="url-userinfo"),
        pytest.param(f"postgres://u:{S}@db:5432/x", id="postgres"),
        pytest.param(f"https://h/o?se=2025&sig={S}&sp=r", id="sas-sig"),
        pytest.param(f"https://b.s3.amazonaws.com/k?X-Amz-Credential={S}&X-Amz-Date=1", id="amz-cred"),
        pytest.param(f"https://b/k?X-Amz-Signature={S}", id="amz-sig"),
        pytest.param(f"https://storage.googleapis.com/b/k?X-Goog-Signature={S}", id="goog-sig"),
        pytest.param(f"https://h/x?access_token={S}", id="access-token"),
        pytest.param(f"https://h/x?key={S}", id="query-key"),
        pytest.param(f"python train.py trainer.api_key={S} lr=0.1", id="hydra"),
        pytest.param(f"python train.py +model.hub_token={S}", id="hydra-append"),
        pytest.param(f"HF_TOKEN={S} python train.py", id="env-in-command"),
        pytest.param(f"rm -rf out --token {S}", id="option-space"),
        pytest.param(f"upload --api-key={S}", id="option-eq"),
        pytest.param(f"ValueError: login failed: password={S}", id="exception"),
        pytest.param(f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={S}==;x=y", id="azure"),
        pytest.param(f"Server=h;User ID=u;Password={S};", id="odbc"),
        pytest.param(f'{{"api_key": "{S}"}}', id="json"),
        pytest.param(f"db_password: {S}", id="yaml"),
        pytest.param(f"HF_TOKEN = '{S}'", id="toml"),
        pytest.param(f"Authorization: Bearer {S}", id="bearer"),
    ],
)  # fmt: skip
def test_every_secret_form_is_redacted(text: str) -> None:
    out = redact_text(text, secrets=())
    assert S not in out and REDACTED in out, out
    assert redact_text(out, secrets=()) == out  # idempotent: a record read and rewritten


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("--max-new-tokens 512 --tokenizer bert-base", id="token-counts"),
        pytest.param("tokenizer=bert num_tokens=5 sort_key=loss", id="not-secret-names"),
        pytest.param("sha256:9f86d081884c7d65 xxh3_128:0123456789abcdef0123", id="hashes"),
        pytest.param("git@github.com:o/r.git https://h/x@y", id="no-userinfo"),
        pytest.param("sorted(x, key=lambda kv: kv[0])", id="bare-key-outside-a-query"),
        pytest.param("board's token: filled in when it is known", id="prose-after-colon"),
        pytest.param("KEY_PATH=/etc/k.pem HF_HOME=/data", id="paths-to-secrets"),
        pytest.param("google-auth==2.40.1 oauthlib==3.2.2 keyring==25.6.0", id="requirements"),
        pytest.param('{"google-auth": "2.40.1", "secretstorage": "3.3.3.post1"}', id="pkg-json"),
    ],
)  # fmt: skip
def test_names_that_are_not_secrets_are_kept(text: str) -> None:
    assert redact_text(text, secrets=()) == text


def test_a_package_named_like_a_secret_keeps_its_version_in_a_record() -> None:
    # Provenance's package list: a distribution's name is not a variable's name.
    packages = {"google-auth": "2.40.1", "oauthlib": "3.2.2", "keyring": "25.6.0rc1"}
    assert redact.redact_record({"packages": packages}) == {"packages": packages}
    assert redact.redact_record({"api_key": "abc123def456"}) == {"api_key": REDACTED}


def test_a_value_learned_from_the_spec_is_hidden_where_it_recurs() -> None:
    password = "SEKRIT0learned77"
    try:
        parse_spec(
            f'name = "t"\ncommand = ["python", "t.py"]\n'
            f'[checkpoint]\nmirror = "s3://ak:{password}@bucket/x"\n'
            f'[env]\nMY_DB_PASSWORD = "SEKRIT0envval55"\n'
        )
        # boto's error quotes the secret bare, without the URL around it
        said = redact_text(f"SignatureDoesNotMatch for {password}; env SEKRIT0envval55")
        assert "SEKRIT0" not in said, said
    finally:
        redact.forget_learned()


def test_argv_and_records() -> None:
    argv = ["train.py", "--api-key", S, f"--token={S}", f"trainer.api_key={S}", "--lr", "3e-4"]
    assert S not in json.dumps(redact_argv(argv, secrets=()))
    event = {"kind": "step", "t": 1.0, "step": 3, "loss": 1.23, "samples": 8}
    assert redact_record(event) is event  # the hot path: nothing copied
    nested = {"kind": "x", "auth_token": S, "note": [f"--token {S}"], "key": "xxh3_128:ab"}
    line = jsonl_line(nested).decode()
    assert S not in line and '"key":"xxh3_128:ab"' in line, line


def test_text_is_redacted_unless_raw_and_bytes_are_payloads(tmp_path: Path) -> None:
    write_atomic(tmp_path / "report.txt", f"url s3://u:{S}@b")
    write_json_atomic(tmp_path / "v.json", {"cause": f"password={S}"})
    write_atomic(tmp_path / "spec.toml", f"mirror = 's3://u:{S}@b'", raw=True)
    write_atomic(tmp_path / "blob", f"s3://u:{S}@b".encode())
    assert S not in (tmp_path / "report.txt").read_text()
    assert S not in (tmp_path / "v.json").read_text()
    assert S in (tmp_path / "spec.toml").read_text()  # the user's own, for resume
    assert S in (tmp_path / "blob").read_text()  # a payload, as it is


def test_kubernetes_env_secrets_go_into_a_secret_not_the_configmap(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "spec.toml").write_text(
        'name = "k"\ncommand = ["python", "train.py"]\n'
        f'[env]\nHF_TOKEN = "{S}"\nLOG_LEVEL = "info"\n'
    )
    out = export_manifests(load_spec(tmp_path / "spec.toml"), KubernetesOptions(image="i:1"))
    docs = list(yaml.safe_load_all(out.yaml()))
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert S not in json.dumps(docs) and "LOG_LEVEL" in config["data"]["spec.toml"]
    job = next(d for d in docs if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": f"{out.job_name}-env"}}]
    [secret] = list(yaml.safe_load_all(out.secret_yaml() or ""))
    assert secret["kind"] == "Secret" and secret["stringData"] == {"HF_TOKEN": S}
    target = tmp_path / "job.yaml"
    assert main(["export", "kubernetes", str(tmp_path / "spec.toml"), "--image", "i:1",
                 "-o", str(target)]) == 0  # fmt: skip
    secret_file = tmp_path / "job.secret.yaml"
    assert S not in target.read_text() and S in secret_file.read_text()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    redact.forget_learned()


# ---- every string field of the declaration ---------------------------------------------------


def _strip_none(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if type(None) in get_args(tp) and len(args) == 1 else tp


def string_slots(cls: type = RunSpec, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path, "str" | "list" | "dict", rules) of every field that holds strings."""
    hints = typing.get_type_hints(cls)
    for name, f in fields_of(cls).items():
        tp = _strip_none(hints[name])
        if dataclasses.is_dataclass(tp):
            yield from string_slots(tp, f"{prefix}{name}.")  # type: ignore[arg-type]
        elif tp is str:
            yield f"{prefix}{name}", "str", rules_of(f)
        elif get_origin(tp) is list and get_args(tp) == (str,):
            yield f"{prefix}{name}", "list", rules_of(f)
        elif get_origin(tp) is dict and get_args(tp)[-1] is str:
            yield f"{prefix}{name}", "dict", rules_of(f)


def _forms(marker: str) -> list[str]:
    """Secret forms holding ``marker``, in the order a field is offered them."""
    return [
        f"s3://user:{marker}@bucket/x",
        f"https://h/x?sig={marker}",
        f"--token={marker}",
        f"api_key={marker}",
        f"HF_TOKEN={marker} python train.py",
    ]


def planted_slots() -> tuple[list[tuple[str, str, str]], list[str]]:
    """(path, kind, planted value) of every string field that accepts a secret form, and
    the paths of those whose declared rules accept none."""
    planted, skipped = [], []
    for i, (path, kind, rules) in enumerate(string_slots()):
        marker = f"SEKRIT0f{i:02d}x"
        value = next((v for v in _forms(marker) if not check_value(rules, v, path)), None)
        if value is None:
            skipped.append(path)
        else:
            planted.append((path, kind, value))
    return planted, skipped


PLANTED, SKIPPED = planted_slots()
ENABLE = {
    "inference": {"input": '"items.jsonl"'},
    "serving": {
        "url": '"http://127.0.0.1:8000/v1"', "ready_url": '"http://127.0.0.1:8000/health"',
        "rate": "1.0", "duration": '"10s"',
    },
}  # fmt: skip


def _spec_text(path: str, kind: str, value: str) -> str:
    *section, name = path.split(".")
    key = "API_TOKEN" if path == "env" else "k"
    item = {"str": json.dumps(value), "list": f"[{json.dumps(value)}]"}.get(
        kind, f"{{ {key} = {json.dumps(value)} }}"
    )
    top = {"name": '"t"', "command": '["python", "train.py"]'}
    if not section:
        top[name] = item
        return "".join(f"{k} = {v}\n" for k, v in top.items())
    table = ".".join(section)
    enable = {k: v for k, v in ENABLE.get(table, {}).items() if k != name}
    return (
        "".join(f"{k} = {v}\n" for k, v in top.items())
        + f"[{table}]\n{name} = {item}\n"
        + "".join(f"{k} = {v}\n" for k, v in enable.items())
    )


def test_the_declaration_is_planted_whole() -> None:
    # A field added tomorrow changes these counts: it is planted (or skipped by its rules)
    # the day it is added. Skipped ones accept no free text (choices, patterns, formats).
    assert len(PLANTED) + len(SKIPPED) == len(list(string_slots()))
    assert len(PLANTED) >= 35, PLANTED
    assert set(SKIPPED) >= {"limits.on_divergence", "acceptance.metrics", "expect.python"}


@pytest.mark.parametrize("path,kind,value", [pytest.param(*p, id=p[0]) for p in PLANTED])
def test_a_secret_planted_in_a_spec_field_reaches_no_export(
    tmp_path: Path, path: str, kind: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = value.split("SEKRIT0", 1)[1][:4]
    marker = "SEKRIT0" + marker
    (tmp_path / "train.py").write_text("print('training')\n")
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(_spec_text(path, kind, value))
    try:
        try:
            spec = load_spec(spec_file)
        except SpecError:
            tally("secrets planted in spec fields", tried=1)
            return  # refused by a rule across fields: nothing written
        written: list[Path] = []
        for args in (
            [
                "export",
                "kubernetes",
                str(spec_file),
                "--image",
                "i:1",
                "-o",
                str(tmp_path / "k.yaml"),
            ],
            ["export", "skypilot", str(spec_file), "-o", str(tmp_path / "sky.yaml")],
            ["export", "kubernetes", str(spec_file), "--image", "i:1"],
            ["spec", "check", str(spec_file)],
        ):
            main(args)  # a refusal (exit 2) says why on stderr, redacted like the rest
        ws = Workspace(tmp_path / "ws" / ".acceptrun")
        try:
            script = batch_script(spec, workspace=ws, run_id="r1", spec_file=spec_file,
                                  job_dir=tmp_path / "job")  # fmt: skip
            write_atomic(tmp_path / "job.sbatch", script)  # as acceptrun submit writes it
        except UserError:
            pass
        written = [p for p in tmp_path.rglob("*") if p.is_file()]
        own = {spec_file, tmp_path / "train.py", tmp_path / "k.secret.yaml"}
        captured = capsys.readouterr()
        leaks = [str(p.name) for p in written if p not in own and marker in p.read_text()]
        leaks += ["terminal"] if marker in captured.out + captured.err else []
        if (tmp_path / "k.secret.yaml").exists():  # [env] secrets: the Secret alone has them
            assert path == "env" and marker in (tmp_path / "k.secret.yaml").read_text()
        tally("secrets planted in spec fields", tried=1, secrets=len(leaks))
        assert not leaks, f"{path} = {value!r} leaked into {leaks}"
    finally:
        redact.forget_learned()
