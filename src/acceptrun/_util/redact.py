"""Secrets never reach a record: the one place that decides what a secret looks like.

A record is shared (reports are mailed, records are copied to mirrors and exported to
MLflow), so whatever acceptrun writes from the outside world goes through here first:

- environment variables whose name looks secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``WANDB_API_KEY``, ``DB_PASSWORD``, ...): their values are secrets wherever they appear
  afterwards, in a log line quoted as evidence as much as in the environment itself;
- credentials in URLs (``https://user:password@host``, ``s3://key:secret@bucket``);
- command-line arguments of secret-looking options (``--api-key X``, ``--token=X``).

Each is replaced by ``<redacted>``. What stays untouched are the user's own files: the
workload's stdout.log and stderr.log (its own output, kept whole for debugging) and the
frozen copy of the spec (which the user wrote and ``acceptrun reproduce`` needs); what
acceptrun *quotes* from them is redacted.

>>> redact_text("push to https://bob:hunter2@example.com/x.git", secrets=())
'push to https://<redacted>@example.com/x.git'
>>> redact_argv(["train.py", "--api-key", "abc123", "--token=xyz", "--lr", "3e-4"])
['train.py', '--api-key', '<redacted>', '--token=<redacted>', '--lr', '3e-4']
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_NAME",
    "is_secret_name",
    "redact_argv",
    "redact_obj",
    "redact_spec",
    "redact_text",
    "redact_url",
    "secret_values",
]

REDACTED = "<redacted>"
# Names of variables and options that hold secrets: API_KEY, ACCESS_KEY, HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD, *_AUTH, AUTHORIZATION, private keys, cookies.
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH(?!OR)|SESSION|COOKIE|SIGNATURE|PRIVATE",
    re.IGNORECASE,
)
# Names that match the pattern above but hold no secret: counts and limits of tokens
# (--max-new-tokens), tokenizers, keywords, and paths to a secret (not the secret).
_NOT_SECRET = re.compile(
    r"TOKENS|TOKENIZER|KEYWORD|MONKEY|KEYBOARD|HASHSEED|SORT_?KEY|PASSTHROUGH"
    r"|(^|_)(MAX|MIN|NUM|N)_|_(PATH|FILE|DIR)$|^PATH$|XDG_SESSION|SESSION_MANAGER",
    re.IGNORECASE,
)
# scheme://userinfo@ -> the userinfo goes, whether "user:password" or a bare token
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']+@")
# --api-key=VALUE, --token VALUE (in a line of text); the option's name must look secret.
_OPTION_WORD = r"--?[A-Za-z0-9][A-Za-z0-9_.-]*"
_OPTION_IN_TEXT = re.compile(rf"({_OPTION_WORD})(=|[ \t]+)([^\s\"']+)")
# Authorization: Bearer xyz / "Authorization": "Basic ..."
_BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}")
# A value shorter than this is not replaced where it appears in text: "1" or "yes" in an
# env var named *_TOKEN_LIMIT would otherwise blank out every "1" in a log.
MIN_SECRET_LEN = 6


def is_secret_name(name: str) -> bool:
    """Does a variable or option with this name hold a secret?"""
    bare = name.lstrip("-").replace("-", "_")
    return SECRET_NAME.search(bare) is not None and _NOT_SECRET.search(bare) is None


def secret_values(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of the secret-looking variables of ``env`` (default: this process's), longest first."""
    env = os.environ if env is None else env
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


def redact_url(text: str) -> str:
    """Remove credentials from every URL in ``text``."""
    return _URL_USERINFO.sub(rf"\1{REDACTED}@", text)


def _option(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    if not is_secret_name(name) or value.startswith("-"):
        return match.group(0)
    return f"{name}{sep}{REDACTED}"


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with URL credentials, secret options and known secret values replaced.

    ``secrets`` are values to replace wherever they appear (default: the secret-looking
    variables of this process's environment, :func:`secret_values`).
    """
    for value in secret_values() if secrets is None else secrets:
        if len(value) >= MIN_SECRET_LEN:
            text = text.replace(value, REDACTED)
    text = redact_url(text)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    return _OPTION_IN_TEXT.sub(_option, text)


def redact_argv(argv: Iterable[str], secrets: Iterable[str] | None = None) -> list[str]:
    """A command line with the values of secret options (and known secrets) replaced."""
    known = tuple(secret_values() if secrets is None else secrets)
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in argv):
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if arg.startswith("-") and is_secret_name(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg, known))
    return out


def redact_obj(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A JSON-like value with every string redacted (:func:`redact_text`); keys kept."""
    known = tuple(secret_values() if secrets is None else secrets)
    if isinstance(obj, str):
        return redact_text(obj, known)
    if isinstance(obj, Mapping):
        return {k: redact_obj(v, known) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v, known) for v in obj]
    return obj


def redact_spec(spec: Mapping[str, Any], secrets: Iterable[str] | None = None) -> dict[str, Any]:
    """A spec (as a dict) fit to leave the machine: the command's secret options, the
    values of secret-looking ``env`` entries and any credential in a string replaced."""
    known = tuple(secret_values() if secrets is None else secrets)
    out: dict[str, Any] = redact_obj(dict(spec), known)
    command = spec.get("command")
    if isinstance(command, list | tuple):
        out["command"] = redact_argv(command, known)
    env = spec.get("env")
    if isinstance(env, Mapping):
        values = tuple(str(v) for k, v in env.items() if is_secret_name(str(k)) and v)
        out["env"] = {k: REDACTED if is_secret_name(str(k)) else v for k, v in out["env"].items()}
        out = redact_obj(out, values + known)
    return out
