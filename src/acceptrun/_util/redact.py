"""Secrets never reach a record: the one place that decides what a secret looks like.

A record is shared (reports are mailed, records are copied to mirrors and exported to
MLflow), so whatever acceptrun writes or shows passes through here on the way out
(:mod:`acceptrun._util.durable` for record files, the console handler and the CLI's
streams for the terminal, the board's one send function, every export).

Known by NAME:

- environment variables whose name looks secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``WANDB_API_KEY``, ``DB_PASSWORD``, ...): their values are secrets wherever they appear
  afterwards, in a log line quoted as evidence as much as in the environment itself; the
  same for the spec's ``[env]``, the fields it declares ``secret=True`` (a webhook URL),
  the variables that its ``secret_env=True`` fields name (``notify.smtp_password_env =
  "DB_PASSWORD"``: the variable's value is learned, its name is not a secret) and any
  value found in a secret form in the spec (:func:`learn_spec`);
- credentials in URLs (``https://user:password@host``, ``s3://key:secret@bucket``);
- assignments with a secret-looking name: ``KEY=value`` and ``key: value`` (a query
  string's ``?sig=...&X-Amz-Signature=...``, a Hydra override ``trainer.api_key=...``
  whose last dotted part decides, ``HF_TOKEN=x python train.py`` in a string command, a
  connection string's ``AccountKey=...;`` or ``Password=...;``, JSON's ``"token": "x"``);
- values of secret-looking options (``--api-key X``, ``--token=X``).

Known by SHAPE, whatever name they are printed under (:mod:`acceptrun._util.secret_shapes`):
the regex rules of Yelp's detect-secrets (GitHub, GitLab, AWS key ids, Slack, Stripe, JWTs,
private keys, ...; its version is :func:`~acceptrun._util.secret_shapes.rule_set_version`)
compiled on RE2, and a small table of the families it lacks (Hugging Face, OpenAI project
keys, Anthropic, Google API keys, GitHub fine-grained tokens, whole PEM and OpenSSH key
blocks, ``Authorization: <any scheme> <credential>``, ``Bearer``/``Basic``/``Token``).

Each is replaced by ``<redacted>``. Deliberately NOT hidden, because they are no secrets
and a record without them is useless: placeholders (an option's metavar ``--token
TOKEN``, ``<token>``, ``$HF_TOKEN``, ``${HF_TOKEN}``, ``***``), names (``known keys: a,
b``, ``TOKENS``, ``--max-new-tokens``, a ``*_env`` field's variable name), paths to a
secret (``--keyfile PATH``, ``key_path=...``: names ending in file, path or dir),
versions (``google-auth==2.40.1``), and hex digests, uuids and run ids (detect-secrets'
entropy plugins are not used: they would hide every sha256 and xxhash of a record; its
public-IP rule is no credential). What stays untouched are the user's own files: the
workload's stdout.log and stderr.log (its own output, kept whole for debugging) and the
frozen copy of the spec (which the user wrote and ``acceptrun resume`` needs to reach the
real mirror); what acceptrun *quotes* from them is redacted.

Every pattern runs in time linear in its input: each here is anchored on a literal
(``://``, ``=``, ``:``, a leading ``-``) or on the start of a word (a lookbehind stops a
match from starting inside a longer name), and names are bounded to 128 characters, so
no input makes the engine retry a long span from every position; the shapes run on RE2
(tests/integration/test_redact_linear.py times both on 1 MB and 4 MB inputs built from
their own literals). The shapes cost nothing until the first string that could hold one
(11 characters or more), and a step event's numbers and short words are never scanned.

>>> redact_text("push to https://bob:hunter2@example.com/x.git", secrets=())
'push to https://<redacted>@example.com/x.git'
>>> redact_argv(["train.py", "--api-key", "abc123", "--token=xyz", "--lr", "3e-4"])
['train.py', '--api-key', '<redacted>', '--token=<redacted>', '--lr', '3e-4']
>>> redact_text("python train.py trainer.api_key=abc123 lr=0.1", secrets=())
'python train.py trainer.api_key=<redacted> lr=0.1'
>>> redact_text("HTTP 401 for hf_QxLmNoPqRsTuVwXyZaBcDeFgHiJkLmNoPq; see --token TOKEN", secrets=())
'HTTP 401 for <redacted>; see --token TOKEN'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from acceptrun._util.secret_shapes import hide_shapes, is_placeholder, shape_values

__all__ = [
    "MIN_SECRET_LEN",
    "REDACTED",
    "SECRET_NAME",
    "declare_secret_env_fields",
    "declare_secret_fields",
    "forget_learned",
    "is_secret_name",
    "learn",
    "learn_spec",
    "redact_argv",
    "redact_obj",
    "redact_record",
    "redact_spec",
    "redact_text",
    "redact_url",
    "secret_values",
    "secrets_in",
    "without_shapes",
]

REDACTED = "<redacted>"
# Names of variables and options that hold secrets: API_KEY, ACCESS_KEY, HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD, *_AUTH, AUTHORIZATION, private keys, cookies, the
# signature and credential of a presigned URL (X-Amz-Signature, X-Goog-Credential, sig).
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH(?!OR)|SESSION|COOKIE|SIGNATURE"
    r"|PRIVATE|^SIG$",
    re.IGNORECASE,
)
# Names that match the pattern above but hold no secret: counts and limits of tokens
# (--max-new-tokens), tokenizers, keywords, the plural noun of a message ("known keys:
# a, b"), and paths to a secret (not the secret: KEY_PATH, --keyfile, secrets_dir).
_NOT_SECRET = re.compile(
    r"TOKENS|TOKENIZER|KEYWORD|MONKEY|KEYBOARD|HASHSEED|SORT_?KEY|PASSTHROUGH|^KEYS$"
    r"|(^|_)(MAX|MIN|NUM|N)_|(PATH|FILE|DIR)$|XDG_SESSION|SESSION_MANAGER",
    re.IGNORECASE,
)
# A name ending in _env holds the NAME of a variable (smtp_password_env = "DB_PASSWORD"),
# not its value: the name is no secret (the variable's value is, see learn_spec).
_NAMES_A_VARIABLE = re.compile(r"_ENV$", re.IGNORECASE)
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# scheme://userinfo@ -> the userinfo goes, whether "user:password" or a bare token.
# Anchored on "://"; the span stops at the first "/", so scans never overlap (linear).
# Greedy to the last "@" of the authority: a password with a raw "@" goes whole.
_URL_USERINFO = re.compile(r"://([^/\s?#\"'<>]*)@")
# A name followed by "=" or ":" (KEY=value, key: value, "key": "value", trainer.api_key=v),
# or an option followed by "=" or blanks (--token=X, --api-key X). The lookbehind keeps a
# match from starting inside a longer word, and names are bounded: linear.
_NAME_CHARS = r"[\w.\-]"
_ASSIGN = re.compile(
    rf"(?<!{_NAME_CHARS})(?P<opt>-{{1,2}}[A-Za-z0-9]{_NAME_CHARS}{{0,127}})(?P<osep>=|[ \t]{{1,8}})"
    rf"|(?<!{_NAME_CHARS})(?P<q>[\"']?)(?P<name>[+~]{{0,2}}[A-Za-z_]{_NAME_CHARS}{{0,127}})(?P=q)"
    r"[ \t]{0,8}(?P<sep>[=:])[ \t]{0,8}"
)
# The value after a secret name: quoted (to the closing quote, or the end of the line), or
# a run without blanks and the separators of query and connection strings.
# A ${NAME} placeholder is one value (a run would stop at its brace).
_VALUE = re.compile(r"\$\{\w{1,128}\}|\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"'&;,<>()\[\]{}]+")
# After "name:" (prose as much as YAML), an unquoted value is a secret when it has a
# character other than a letter, or is long: "password: hunter2", not "token: str".
_SECRET_LOOKING = re.compile(r"[^A-Za-z]|^.{8}")
# A value shaped like a version ("2.40.1", "==1.0.0rc1", "v3.2.post1") is never a secret:
# distributions named like secrets (google-auth, oauthlib, keyring) keep their versions in
# provenance ("google-auth==2.40.1", {"google-auth": "2.40.1"}), and no credential has this
# shape. The suffix must start with a letter (or "." then a letter), so the two parts never
# trade characters; the lookbehind starts the digits only where a run of them starts, so a
# search does not retry a long run from each of its digits: linear however it is used.
_VERSION = re.compile(
    r"[=<>!~]{0,3}v?(?<![\d.])\d+(?:\.\d+)+(?:(?:[A-Za-z+!_-]|\.(?=[A-Za-z]))[\w.+!-]*)?"
)
# A string with none of these cannot hold a form above (only a known value).
_MAY_HOLD_FORM = re.compile(r"[=:@ \t]")
# A value shorter than this is not replaced where it appears in text: "1" or "yes" in an
# env var named *_TOKEN_LIMIT would otherwise blank out every "1" in a log.
MIN_SECRET_LEN = 6

# False inside without_shapes(): text acceptrun wrote itself, where no shape is looked for.
# A context variable: a thread started meanwhile (a supervisor's) still looks for them.
_scan_shapes: ContextVar[bool] = ContextVar("acceptrun_scan_shapes", default=True)

# Values learned from the spec being run (its [env], values in secret forms): secrets for
# this process from then on, wherever they recur.
_learned: set[str] = set()
_env_snapshot: dict[Any, Any] | None = None
_env_values: tuple[str, ...] = ()


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Does a variable, option or key with this name hold a secret?

    A dotted name (a Hydra override's ``trainer.api_key``) is judged by its last part.
    """
    bare = name.lstrip("-+~").rsplit(".", 1)[-1].replace("-", "_")
    return SECRET_NAME.search(bare) is not None and _NOT_SECRET.search(bare) is None


def secret_values(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of the secret-looking variables of ``env`` (default: this process's), longest first."""
    if env is None:
        return _process_env_values()
    return _values_of(env)


def _values_of(env: Mapping[str, str]) -> tuple[str, ...]:
    values = {
        str(v) for k, v in env.items() if is_secret_name(str(k)) and len(str(v)) >= MIN_SECRET_LEN
    }
    return tuple(sorted(values, key=len, reverse=True))


def _process_env_values() -> tuple[str, ...]:
    # The hot path (an event per step) must not walk the environment each time: it is
    # compared with a snapshot (one C-level dict comparison) and walked when it changed.
    global _env_snapshot, _env_values
    data = getattr(os.environ, "_data", None)
    if data is None or data != _env_snapshot:
        _env_values = _values_of(os.environ)
        _env_snapshot = dict(data) if data is not None else None
    return _env_values


def learn(values: Iterable[str]) -> None:
    """Treat ``values`` as secrets in this process from now on (those long enough)."""
    _learned.update(v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LEN)


def forget_learned() -> None:
    """Drop the learned values (a test that runs several specs in one process)."""
    _learned.clear()


# Spec fields whose whole value is a secret (a webhook URL): (section, field) pairs that the
# spec declaration (spec/model.py, ``secret=True``) declares when it is imported.
_secret_fields: set[tuple[str, str]] = set()


def declare_secret_fields(fields: Iterable[tuple[str, str]]) -> None:
    """Spec fields (section, name) whose values :func:`learn_spec` learns whole."""
    _secret_fields.update(fields)


# Spec fields that name an environment variable holding a secret (notify.smtp_password_env,
# ``secret_env=True``): the variable's value is learned, never the name.
_secret_env_fields: set[tuple[str, str]] = set()


def declare_secret_env_fields(fields: Iterable[tuple[str, str]]) -> None:
    """Spec fields (section, name) that name a variable whose value :func:`learn_spec`
    learns (from the spec's ``[env]``, else this process's environment)."""
    _secret_env_fields.update(fields)


def _named_values(spec: Mapping[str, Any], env: Mapping[str, Any]) -> list[str]:
    """The values of the variables that the secret-naming fields of ``spec`` name."""
    values = []
    for section, name in _secret_env_fields:
        table = spec.get(section)
        variable = table.get(name) if isinstance(table, Mapping) else None
        if isinstance(variable, str) and variable:
            value = env.get(variable, os.environ.get(variable))
            if isinstance(value, str):
                values.append(value)
    return values


def learn_spec(spec: Any) -> None:
    """Learn the secrets of a spec (a dict or a spec object): its ``[env]`` values with a
    secret-looking name, the values of the fields declared secret, the values of the
    variables that the fields declared ``secret_env`` name (not their names), and every
    value found in a secret form in any of its strings."""
    env = spec.get("env") if isinstance(spec, Mapping) else getattr(spec, "env", None)
    if isinstance(env, Mapping):
        learn(_values_of(env))
    spec = _plain(spec)
    found: list[str] = []
    if isinstance(spec, Mapping):
        found += _named_values(spec, env if isinstance(env, Mapping) else {})
        for section, name in _secret_fields:
            table = spec.get(section)
            value = table.get(name) if isinstance(table, Mapping) else None
            if isinstance(value, str):
                found.append(value)
    _walk_strings(spec, found)
    command = spec.get("command") if isinstance(spec, Mapping) else None
    if isinstance(command, list | tuple):
        found += _argv_secrets([str(a) for a in command])
    learn(found)


def _plain(obj: Any) -> Any:
    """A dataclass tree (a spec object) as dicts and lists; other values as they are."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _walk_strings(obj: Any, found: list[str]) -> None:
    if isinstance(obj, str):
        found += secrets_in(obj)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            if _secret_item(k, v):
                found.append(v)
            _walk_strings(v, found)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _walk_strings(v, found)


def _secret_key(key: Any) -> bool:
    # A record's own "key" fields (a probe cache's hash, a usage warning's id) are names,
    # not secrets: bare "key" counts in text (?key=..., key=...), not as a JSON key.
    return isinstance(key, str) and key.lower() != "key" and is_secret_name(key)


def _secret_item(key: Any, value: Any) -> bool:
    """Is ``value``, found under ``key`` in a mapping, a secret to hide whole?"""
    return (
        isinstance(value, str) and bool(value) and _secret_key(key)
        and _VERSION.fullmatch(value) is None and not _names_a_variable(key, value)
    )  # fmt: skip


def _names_a_variable(key: str, value: str) -> bool:
    """``smtp_password_env = "DB_PASSWORD"``: the name of a variable, not its value."""
    return _NAMES_A_VARIABLE.search(key) is not None and _VARIABLE_NAME.fullmatch(value) is not None


def _known(secrets: Iterable[str] | None) -> tuple[str, ...]:
    base = _process_env_values() if secrets is None else tuple(secrets)
    if not _learned:
        return base
    return tuple(sorted({*base, *_learned}, key=len, reverse=True))


def redact_url(text: str) -> str:
    """Remove credentials from every URL in ``text``."""
    if "://" not in text:
        return text
    return _URL_USERINFO.sub(rf"://{REDACTED}@", text)


def _forms(text: str, found: list[str] | None) -> str:
    """``text`` with every secret form replaced; the values replaced go to ``found``."""
    if found is not None:
        for m in _URL_USERINFO.finditer(text):
            info = m.group(1)
            found += [info, info.partition(":")[2]]
    text = redact_url(text)
    if "=" not in text and ":" not in text and "-" not in text:
        return text
    out: list[str] = []
    pos = done = 0
    while True:
        a = _ASSIGN.search(text, pos)
        if a is None:
            break
        pos = a.end()
        name = a.group("opt") or a.group("name")
        if not is_secret_name(name):
            continue
        if name.lower() == "key" and (a.start() == 0 or text[a.start() - 1] not in "?&;"):
            continue  # a bare "key" is a secret in a query string, not in key=lambda ...
        v = _VALUE.match(text, pos)
        if v is None:
            continue
        value = v.group(0)
        if a.group("osep") and a.group("osep") != "=" and value.startswith("-"):
            continue  # "--token --lr": the next option, not a value
        quoted = value[0] in "\"'"
        inner = value[1:].rstrip(value[0]) if quoted else value
        if not inner or is_placeholder(inner, metavar=a.group("osep") not in (None, "=")):
            pos = v.end()
            continue  # <redacted>, $HF_TOKEN, ***; TOKEN after an option: its metavar
        if _names_a_variable(name, inner):
            continue  # smtp_password_env=DB_PASSWORD: the variable's name, not its value
        if a.group("sep") == ":" and not quoted and not _SECRET_LOOKING.search(inner):
            continue  # "token: filled in when...": prose, not "password: hunter2"
        if _VERSION.fullmatch(inner):
            continue  # "google-auth==2.40.1": a distribution and its version
        if found is not None:
            found.append(inner)
        out += [text[done:pos], value.replace(inner, REDACTED, 1)]
        pos = done = v.end()
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def secrets_in(text: str) -> list[str]:
    """The values in ``text`` that a secret form holds (the ones :func:`redact_text` hides)."""
    found = shape_values(text)
    _forms(text, found)
    return [v for v in found if len(v) >= MIN_SECRET_LEN]


def _redact_str(text: str, known: tuple[str, ...]) -> str:
    if len(text) < MIN_SECRET_LEN:
        return text  # "step", "ok": no secret fits (the hot path of step events)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    if _MAY_HOLD_FORM.search(text) is not None:
        text = _forms(text, None)  # first: a URL's whole userinfo, where a rule hides less
    return hide_shapes(text) if _scan_shapes.get() else text


@contextlib.contextmanager
def without_shapes() -> Iterator[None]:
    """Redact without looking for shapes, in this context: for text acceptrun wrote itself
    (a command's ``--help``), which holds no credential a workload printed. The shapes'
    first use reads detect-secrets' rules (about 0.15 s), which ``--help`` need not pay;
    names, URLs and known values are still hidden."""
    token = _scan_shapes.set(False)
    try:
        yield
    finally:
        _scan_shapes.reset(token)


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with URL credentials, secret assignments and options and known secret
    values replaced.

    ``secrets`` are values to replace wherever they appear (default: the secret-looking
    variables of this process's environment, :func:`secret_values`); the values learned
    from the spec (:func:`learn_spec`) are always added.
    """
    return _redact_str(text, _known(secrets))


# An option's name: what a parser reads as one. A key block ("-----BEGIN ... KEY-----")
# starts with dashes too and names a key, but it is an argument's value, not an option.
_OPTION = re.compile(rf"-{{1,2}}[A-Za-z0-9]{_NAME_CHARS}{{0,127}}")


def _secret_option(name: str) -> bool:
    """Is ``name`` (an argument, or its part before "=") an option that takes a secret?"""
    return _OPTION.fullmatch(name) is not None and is_secret_name(name)


def _argv_secrets(argv: list[str]) -> list[str]:
    found: list[str] = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if _secret_option(name):
            if eq:
                found.append(value)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                found.append(argv[i + 1])
        else:
            found += secrets_in(arg)
    return [v for v in found if len(v) >= MIN_SECRET_LEN]


def redact_argv(argv: Iterable[str], secrets: Iterable[str] | None = None) -> list[str]:
    """A command line with the values of secret options replaced (``--token X``,
    ``--api-key=X``), and in every other argument what :func:`redact_text` hides (known
    values, forms, shapes: a key block passed whole as one argument)."""
    known = _known(secrets)
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in argv):
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if _secret_option(name):
            if eq:
                out.append(f"{_redact_str(name, known)}={REDACTED}")
            else:
                out.append(_redact_str(arg, known))
                hide_next = True
            continue
        out.append(_redact_str(arg, known))
    return out


def redact_obj(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A JSON-like value with every string redacted (:func:`redact_text`); keys kept.

    A string value under a secret-looking key (``{"api_key": "x"}``; bare ``"key"`` is a
    record's own name for things) is replaced whole.
    """
    return _redact_any(obj, _known(secrets))


def _redact_any(obj: Any, known: tuple[str, ...]) -> Any:
    if isinstance(obj, str):
        return _redact_str(obj, known)
    if isinstance(obj, Mapping):
        return {
            k: REDACTED if _secret_item(k, v) else _redact_any(v, known) for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [_redact_any(v, known) for v in obj]
    return obj


_SCALARS = frozenset({int, float, bool, type(None)})


def redact_record(obj: Any) -> Any:
    """A record (JSON-like) with its strings redacted, for the writers of record files.

    The hot path (a step event per step): strings too short to hold a secret are not
    looked at, the known values are computed only for a string that might hold one, and
    a record with nothing to hide is returned as it is, not copied.
    """
    known: list[tuple[str, ...]] = []
    return _record(obj, known)


def _record(obj: Any, known: list[tuple[str, ...]]) -> Any:
    if isinstance(obj, str):
        if len(obj) < MIN_SECRET_LEN:
            return obj
        if not known:
            known.append(_known(None))
        return _redact_str(obj, known[0])
    if isinstance(obj, dict):
        out = None
        for k, v in obj.items():
            t = type(v)
            if t in _SCALARS or (t is str and len(v) < MIN_SECRET_LEN and not _secret_key(k)):
                continue  # a number, a short word: the whole of a step event
            new = REDACTED if t is str and _secret_item(k, v) else _record(v, known)
            if new is not v and new != v:
                if out is None:
                    out = dict(obj)
                out[k] = new
        return obj if out is None else out
    if isinstance(obj, list | tuple):
        items = [_record(v, known) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else items
    return obj


def redact_spec(spec: Mapping[str, Any], secrets: Iterable[str] | None = None) -> dict[str, Any]:
    """A spec (as a dict) fit to leave the machine: the command's secret options, the
    values of secret-looking ``env`` entries and any credential in a string replaced."""
    learn_spec(spec)
    known = _known(secrets)
    out: dict[str, Any] = _redact_any(dict(spec), known)
    command = spec.get("command")
    if isinstance(command, list | tuple):
        out["command"] = redact_argv(command, known)
    return out
