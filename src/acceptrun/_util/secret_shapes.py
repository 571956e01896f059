"""Secrets known by their shape, whatever name they are printed under.

A workload's exception may quote a token bare (``401 for ghp_...``, a private key block in
a config dump), where no secret-looking name stands beside it for
:mod:`acceptrun._util.redact` to see. Those are known by shape:

- the regex rules of Yelp's detect-secrets (a maintained rule set: GitHub, GitLab, AWS
  access key ids, Slack, Stripe, SendGrid, PyPI, npm in ``.npmrc``, Discord, Telegram,
  JWTs, private key headers, Twilio, Mailchimp, Azure storage, basic-auth URLs, IBM,
  Cloudant, SoftLayer, Artifactory, Square, OpenAI keys with their ``T3BlbkFJ`` marker),
  read from its plugins' ``denylist`` at first use and compiled on RE2, so the scan is
  linear in its input whatever the input. Its entropy and keyword plugins are not used:
  entropy would hide every sha256 and xxhash of a record, and keywords are
  :mod:`acceptrun._util.redact`'s own business. A rule RE2 cannot read as written is
  translated mechanically (a leading ``(?:(?<=\\W)|(?<=^))`` consumes the character
  before; a ``(?!C)`` at the end of the rule or of its group becomes a check on the
  character after; a bound over 1000, RE2's limit, is split in two) or listed in
  :func:`left_out` with the reason: none is dropped silently;
- :data:`SUPPLEMENTS`, only for families the rule set lacks, each with its provider's
  published format: GitHub fine-grained tokens, Hugging Face, OpenAI project and service
  account keys, Anthropic, Google API keys, npm tokens on their own, an AWS secret key
  quoted after "aws ... secret", whole PEM and OpenSSH private key blocks (to the END line,
  or to the end of a text that was cut), ``Authorization: <any scheme> <credential>`` in
  any case and quoting, HTTP Digest's ``response``, and ``Bearer``/``Basic``/``Token``
  credentials standing alone.

What a rule hides: its capture group when it has one (the rule's context, such as
``aws ... key = '``, stays), else the whole match less the delimiters some rules take
around it; then widened to the end of the token it ends in, so a rule that matches only a
credential's beginning (a GitHub rule whose group is the prefix ``ghp``, a JWT's lazy
signature, a Discord token longer than the rule's 27 characters) still hides all of it.
A value right after a letter or digit is the inside of a longer word (an upper-case hex
digest holding "ACCA" and 16 more) and is kept: the rules as written have no left edge.
A placeholder (``TOKEN``, ``<token>``, ``$HF_TOKEN``, ``***``) is never hidden.

The rules are read at the first text long enough to hold a secret; importing this module
reads nothing. Reading them from detect-secrets costs about 0.15 s (importing it and the
requests library it imports), so the translated rule set is kept in a cache file
(:func:`cache_path`) keyed by what decides it: the source of every detect-secrets module,
this module's own source (the translation and the supplements), the RE2 build and the
Python version. A process whose key matches the file's, and whose file passes its
checksum, compiles the cached patterns on RE2 (about 0.02 s) without importing
detect-secrets; any other reads the rules live and writes the file again. The cached
translation is the live one (tests/unit/test_shape_cache.py compares them). A command's
``--help`` never reads the rules (:func:`acceptrun._util.redact.without_shapes`). After
that, a text goes through one RE2 set (one linear pass naming the rules that match
somewhere; about 1.5 us for a short string) and only the rules it names run on it.

>>> hide_shapes("push failed: 401 for ghp_R8kqZ2vT5mXw1yB7nC3dF6gH9jK0lP4sQ2aE.")
'push failed: 401 for <redacted>.'
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import stat
import sys
import warnings
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "MIN_SHAPE_LEN",
    "SUPPLEMENTS",
    "Supplement",
    "cache_path",
    "hide_shapes",
    "is_placeholder",
    "left_out",
    "rule_set_version",
    "shape_values",
    "taken",
]

REDACTED = "<redacted>"  # the same word as acceptrun._util.redact.REDACTED
# The shortest text a rule can match: Artifactory's "AP" + a hex digit + 8 characters.
# Shorter strings (most strings of a step or checkpoint event) skip the scan.
MIN_SHAPE_LEN = 11


def _has_digit(value: bytes, match: Any) -> bool:
    """A credential after a lower- or upper-case scheme word has a digit ("token 2f1a...",
    not the prose of "token embeddings"); after ``Bearer``/``Basic``/``Token`` spelled as
    a header spells them, any value of 8 or more characters is one."""
    return any(48 <= c <= 57 for c in value) or match.group(0)[:2] in (b"Be", b"Ba", b"To")


def _not_a_scheme(value: bytes, match: Any) -> bool:
    """In "Authorization: Bearer <token>" the scheme word alone is no credential."""
    return value.lower() not in (b"bearer", b"basic", b"token", b"digest", b"negotiate")


class Supplement(NamedTuple):
    """A shape the rule set lacks: its family, an RE2 pattern (group 1, when it has one,
    is what is hidden), and optionally a test the hidden value must pass."""

    family: str
    pattern: str
    accept: Callable[[bytes, Any], bool] | None = None


SUPPLEMENTS: tuple[Supplement, ...] = (
    # GitHub, "Introducing fine-grained personal access tokens" (github.blog, 2022-10-18):
    # "github_pat_" then 82 characters of [A-Za-z0-9_] (22, "_", 59); 22 or more taken.
    Supplement("github fine-grained", r"github_pat_[A-Za-z0-9_]{22,}"),
    # Hugging Face, "User access tokens" (huggingface.co/docs/hub/security-tokens): "hf_"
    # then 34 letters and digits; 30 or more taken.
    Supplement("huggingface", r"\bhf_[A-Za-z0-9]{30,}"),
    # OpenAI, API keys (platform.openai.com/docs/api-reference/authentication): project,
    # service-account and admin keys "sk-proj-", "sk-svcacct-", "sk-admin-" (the rule set's
    # OpenAI rule needs the "T3BlbkFJ" that only legacy keys are sure to hold).
    Supplement("openai", r"\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,}"),
    # Anthropic, API keys (docs.anthropic.com, "API keys"): "sk-ant-api03-..." and admin
    # keys "sk-ant-admin01-...", 95 or more characters in all; 32 or more after the kind.
    Supplement("anthropic", r"\bsk-ant-[a-z]{3,8}[0-9]{2}-[A-Za-z0-9_-]{32,}"),
    # Google Cloud, "Manage API keys" (cloud.google.com/docs/authentication/api-keys):
    # "AIza" then 35 characters of [0-9A-Za-z_-]; 30 or more taken.
    Supplement("google api key", r"\bAIza[0-9A-Za-z_-]{30,}"),
    # npm, "About access tokens" (docs.npmjs.com): granular and classic tokens are "npm_"
    # then 36 letters and digits; the rule set knows them only inside an .npmrc line.
    Supplement("npm", r"\bnpm_[A-Za-z0-9]{36}"),
    # AWS, "Managing access keys" (docs.aws.amazon.com/IAM): a secret access key is 40
    # characters of [A-Za-z0-9/+]; the rule set's quoted-key rule names key/pass/token
    # after "aws" but not "secret".
    Supplement("aws secret", r"""(?i)aws.{0,20}?secret.{0,20}?['"]([0-9a-zA-Z/+]{40})['"]"""),
    # RFC 7468 (PEM: "-----BEGIN RSA PRIVATE KEY-----", "PRIVATE KEY", "ENCRYPTED PRIVATE
    # KEY", "EC PRIVATE KEY") and OpenSSH's PROTOCOL.key ("OPENSSH PRIVATE KEY"): the whole
    # block to its END line, or to the end of a text that was cut (a traceback's repr).
    Supplement(
        "private key block",
        r"-----BEGIN (?:[A-Z0-9]+ ){0,4}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
        r"(?:-----END (?:[A-Z0-9]+ ){0,4}PRIVATE KEY(?: BLOCK)?-----|\z)",
    ),
    # RFC 9110 section 11.6.2: "Authorization: <scheme> <credentials>", any scheme (token,
    # Bearer, Basic ...) and any case, as a header, in JSON ("authorization": "..."), a
    # Python repr or JSON inside a string (\"); the scheme word stays.
    Supplement(
        "authorization header",
        r"""(?i)authorization(?:\\?["'])?[ \t]{0,8}[:=][ \t]{0,8}(?:\\?["'])?"""
        r"""(?:[a-z][a-z0-9_-]{0,31}[ \t]{1,8})?([A-Za-z0-9._~+/-]+=*)""",
        accept=_not_a_scheme,
    ),
    # RFC 7616 section 3.4 (HTTP Digest): the "response" parameter, 32 (MD5) or 64
    # (SHA-256) hex digits, is what proves the password.
    Supplement("digest response", r"""(?i)\bresponse[ \t]*=[ \t]*(?:\\?["'])?([0-9a-f]{32,128})"""),
    # RFC 6750 (Bearer), RFC 7617 (Basic) and GitHub's "token": such a word, any case,
    # then a credential of 8 or more token characters.
    Supplement(
        "bearer, basic or token",
        r"(?i)\b(?:bearer|basic|token)[ \t]{1,8}([A-Za-z0-9._~+/-]{8,}=*)",
        accept=_has_digit,
    ),
)

# Rules of the rule set that are no credentials, with the reason they are not taken.
_NOT_CREDENTIALS = {
    "Public IP (ipv4)": "an address, not a credential (and a four-part version, "
    "1.2.10.4, reads the same)",
}
# A placeholder names a value without being one: <token>, $HF_TOKEN, ${HF_TOKEN}, ***,
# ..., xxx; and an option's metavar (TOKEN, API_KEY: at most 16 capitals, where an AWS
# key id has 20 with digits), which only a value in an option's place is taken for.
_PLACEHOLDER = re.compile(r"<[\w .-]*>|\$\{?[A-Za-z_]\w*\}?|\*{3,}|\.{3}|x{3,}|X{3,}")
_METAVAR = re.compile(r"[A-Z][A-Z_]{0,15}")
# Characters a token is made of: a hidden value is widened over them to its token's end.
_TOKEN_RUN = re.compile(rb"[A-Za-z0-9_\-+/=.]*")
_TRIM_START = b" \t\r\n\"'=:"  # delimiters a rule without a group takes before a token
_TRIM_END = b" \t\r\n\"'."  # ... and after it (and a sentence's full stop)
# A credential starts a token: a value right after a letter or digit is the inside of a
# longer word (an upper-case hex digest holding "ACCA" + 16, "TASK" + 32 letters for a
# Twilio key) and is not hidden. Stricter than the rules as written, which have no left
# boundary; every shape of tests/secret_shapes.py is printed after a blank, quote or "=".
_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def is_placeholder(value: str, *, metavar: bool = False) -> bool:
    """Is ``value`` a placeholder (``<token>``, ``$HF_TOKEN``, ``***``; with ``metavar``,
    an option's metavar too: ``TOKEN``), not a secret?"""
    if value == REDACTED or _PLACEHOLDER.fullmatch(value) is not None:
        return True
    return metavar and _METAVAR.fullmatch(value) is not None


class _Rule(NamedTuple):
    family: str
    pattern: str  # as compiled on RE2
    regex: Any  # re2._Regexp over bytes
    # A translated (?!C): the character after the match ("match") or after group 1
    # ("group") must not be in C.
    not_next: Any | None = None
    not_next_of: str = "match"
    accept: Callable[[bytes, Any], bool] | None = None


class _Scanner(NamedTuple):
    rules: tuple[_Rule, ...]
    left_out: tuple[tuple[str, str, str], ...]  # (family, pattern, reason)
    first: Any  # re2.Set: which rules match somewhere, in one pass


def rule_set_version() -> str:
    """``detect-secrets <version>``: where the rules come from."""
    from importlib.metadata import version

    return f"detect-secrets {version('detect-secrets')}"


def taken() -> list[tuple[str, str]]:
    """(family, pattern as compiled on RE2) of every rule in use, supplements last."""
    return [(r.family, r.pattern) for r in _scanner().rules]


def left_out() -> list[tuple[str, str, str]]:
    """(family, pattern, reason) of every rule of the rule set that is not used."""
    return list(_scanner().left_out)


def _rule_set_plugins() -> dict[str, Any]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    plugins: dict[str, Any] = get_mapping_from_secret_type_to_class()
    return plugins


def keeping_warnings(load: Callable[[], Any]) -> Any:
    """``load()``, with the process's warnings shown as they were before it.

    detect-secrets' logger calls ``logging.captureWarnings(True)`` when it is made, which
    hands every warning to a ``py.warnings`` logger; in a training script with no logging
    set up, that logger prints nothing, so the script's own warnings (and acceptrun's to
    it) vanished the moment the redactor first loaded its rules. Put back as it was.
    """
    shown = warnings.showwarning
    try:
        return load()
    finally:
        if warnings.showwarning is not shown:
            logging.captureWarnings(False)
            warnings.showwarning = shown


class _Translation(NamedTuple):
    """The rule set as RE2 reads it: each rule taken (family, pattern, the character class
    of a translated ``(?!C)`` or None, and whether it follows the match or group 1), and
    each rule left out (family, pattern, reason). What the cache file holds."""

    rules: tuple[tuple[str, str, str | None, str], ...]
    left_out: tuple[tuple[str, str, str], ...]


@functools.cache
def _scanner() -> _Scanner:
    # Imported here: the first text that may hold a secret pays for it, not startup.
    import re2  # type: ignore[import-untyped]

    key = _cache_key()
    found = _read_cache(key) if key else None
    if found is not None:
        with_cache = _compiled(found, re2)
        if with_cache is not None:
            return with_cache
    translation = _translate(re2)
    scanner = _compiled(translation, re2)
    if scanner is None:  # a rule RE2 compiled a moment ago: not reached
        raise RuntimeError("the secret-shape rules did not compile twice alike")
    if key:
        _write_cache(key, translation)
    return scanner


def _options(re2: Any) -> Any:
    options = re2.Options()
    options.log_errors = False  # a rule RE2 refuses is listed, not printed from C++
    return options


def _translate(re2: Any) -> _Translation:
    """The rule set read from detect-secrets' plugins (importing it) and translated."""
    options = _options(re2)
    rules: list[tuple[str, str, str | None, str]] = []
    out: list[tuple[str, str, str]] = []
    plugins: dict[str, Any] = keeping_warnings(_rule_set_plugins)
    for family, plugin in sorted(plugins.items()):
        for rx in getattr(plugin, "denylist", None) or ():
            made = _from_rule_set(family, rx, re2, options)
            if isinstance(made, str):
                out.append((family, rx.pattern, made))
            else:
                rules.append(made)
    return _Translation(tuple(rules), tuple(out))


def _compiled(translation: _Translation, re2: Any) -> _Scanner | None:
    """The scanner of a translation and the supplements; None when RE2 refuses a rule
    (a cache written by another build: the caller reads the rules live)."""
    options = _options(re2)
    rules: list[_Rule] = []
    try:
        for family, pattern, not_next, of in translation.rules:
            nxt = None if not_next is None else re2.compile(not_next.encode(), options)
            rules.append(_Rule(family, pattern, re2.compile(pattern.encode(), options), nxt, of))
    except re2.error:
        return None
    for sup in SUPPLEMENTS:
        regex = re2.compile(sup.pattern.encode(), options)
        rules.append(_Rule(sup.family, sup.pattern, regex, accept=sup.accept))
    set_options = _options(re2)
    set_options.max_mem = 64 << 20  # bytes: the set's DFA holds every rule's states
    first = re2.Set.SearchSet(set_options)
    for rule in rules:
        first.Add(rule.pattern.encode())
    first.Compile()
    return _Scanner(tuple(rules), translation.left_out, first)


# ---- the cache of the translated rule set -------------------------------------------------

ENV_CACHE_DIR = "ACCEPTRUN_CACHE_DIR"
_CACHE_FILE = "secret-shapes.json"


def cache_path() -> Path:
    """The cache file: in ``$ACCEPTRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/acceptrun``,
    else ``~/.cache/acceptrun``."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit).expanduser() / _CACHE_FILE
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "acceptrun" / _CACHE_FILE


def _cache_key() -> str | None:
    """A digest of what decides the translation (None: detect-secrets or RE2 not found,
    or their files unreadable: no cache). About 3 ms: the detect-secrets sources are
    read (about 90 files, 0.5 MB), RE2's files are stat'ed."""
    digest = hashlib.sha256(sys.version.encode())
    try:
        digest.update(Path(__file__).read_bytes())
        for name, read in (("detect_secrets", True), ("re2", False)):
            spec = find_spec(name)
            if spec is None or not spec.submodule_search_locations:
                return None
            for root in spec.submodule_search_locations:
                for path in sorted(Path(root).rglob("*")):
                    if "__pycache__" in path.parts or not path.is_file():
                        continue
                    digest.update(str(path.relative_to(root)).encode() + b"\0")
                    if read and path.suffix == ".py":
                        digest.update(path.read_bytes())
                    else:
                        st = path.stat()
                        digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    except (OSError, ValueError, ImportError):
        return None
    return digest.hexdigest()


def _checksum(key: str, translation: _Translation) -> str:
    text = json.dumps([key, translation.rules, translation.left_out], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_cache(key: str) -> _Translation | None:
    """The cached translation when the file is the user's own regular file, not writable
    by others, of this key, and its checksum holds; else None."""
    try:
        path = cache_path()
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return None
        found = json.loads(path.read_bytes())
        rules = tuple(
            (str(f), str(p), None if n is None else str(n), str(o)) for f, p, n, o in found["rules"]
        )
        out = tuple((str(f), str(p), str(r)) for f, p, r in found["left_out"])
    except (OSError, ValueError, TypeError, KeyError, RuntimeError):  # RuntimeError: no home
        return None
    translation = _Translation(rules, out)
    if found.get("key") != key or found.get("sha256") != _checksum(key, translation):
        return None
    if not rules or any(o not in ("match", "group") for _f, _p, _n, o in rules):
        return None
    return translation


def _write_cache(key: str, translation: _Translation) -> None:
    """Best effort: a cache that cannot be written is read live next time."""
    from acceptrun._util.durable import write_atomic

    body = {
        "key": key,
        "sha256": _checksum(key, translation),
        "rules": translation.rules,
        "left_out": translation.left_out,
    }
    try:
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, json.dumps(body, indent=1), mode=0o600, raw=True)
    except Exception:  # a full disk is a UserError: a cache is never why a command fails
        return


_LOOKBEHIND_START = "(?:(?<=\\W)|(?<=^))"
# (?!C) for one character class C, as the last thing of the rule or of a group. These
# two are compiled when the rules are read (re caches them), not when this is imported.
_NOT_NEXT = r"\(\?!(\\w|\[(?:\\.|[^\]\\])*\])\)(?=\)|$)"
# atom{n,m} with m over RE2's 1000: atom{n}atom{0,m-n}.
_BIG_REPEAT = r"(\[(?:\\.|[^\]\\])*\]|\\.|[^\\()\[\]{}|])\{(\d+),(\d+)\}"


def _from_rule_set(
    family: str, rx: re.Pattern[str], re2: Any, options: Any
) -> tuple[str, str, str | None, str] | str:
    """The rule translated (as :class:`_Translation` holds it), or the reason it is left
    out (RE2 cannot compile it)."""
    if family in _NOT_CREDENTIALS:
        return _NOT_CREDENTIALS[family]
    pattern = rx.pattern
    if rx.flags & re.VERBOSE and re.search(r"\s|#", pattern):
        return "a verbose pattern (blanks and comments), which RE2 does not read"
    if pattern.startswith(_LOOKBEHIND_START):
        pattern = "(?:^|\\W)" + pattern[len(_LOOKBEHIND_START) :]
    not_next, of = None, "match"
    found = list(re.finditer(_NOT_NEXT, pattern))
    if len(found) == 1:
        m = found[0]
        of = "match" if m.end() == len(pattern) else "group"
        if of == "group" and not _closes_group_one(pattern, m.end()):
            return f"a lookahead {m.group(0)} inside the rule, which RE2 lacks"
        not_next = m.group(1)
        re2.compile(not_next.encode(), options)
        pattern = pattern[: m.start()] + pattern[m.end() :]
    pattern = re.sub(_BIG_REPEAT, _split_repeat, pattern)
    flags = "".join(f for f, bit in (("i", re.I), ("s", re.S), ("m", re.M)) if rx.flags & bit)
    if flags:
        pattern = f"(?{flags}){pattern}"
    try:
        re2.compile(pattern.encode(), options)
    except re2.error as e:
        return f"RE2 cannot compile it: {e.args[0].decode() if e.args else e}"
    return (family, pattern, not_next, of)


def _split_repeat(m: re.Match[str]) -> str:
    atom, low, high = m.group(1), int(m.group(2)), int(m.group(3))
    if high <= 1000 or high - low > 1000:
        return m.group(0)  # within RE2's limit, or too big to split once: RE2 says so
    return f"{atom}{{{low}}}{atom}{{0,{high - low}}}"


def _closes_group_one(pattern: str, at: int) -> bool:
    """Is the ")" at ``at`` the end of the pattern's first capture group?"""
    stack: list[bool] = []  # per open parenthesis: is it a capture group?
    captures = 0
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = pattern.index("]", i + 2 if pattern[i + 1 : i + 2] == "]" else i + 1) + 1
            continue
        if c == "(":
            capture = not pattern.startswith("(?", i)
            captures += capture
            stack.append(capture and captures == 1)
        elif c == ")":
            first = stack.pop() if stack else False
            if i == at:
                return first
        i += 1
    return False


def _spans(data: bytes) -> list[tuple[int, int]]:
    """The byte spans of ``data`` that a rule hides, merged and in order."""
    scanner = _scanner()
    which = scanner.first.Match(data)
    if not which:
        return []
    spans: list[tuple[int, int]] = []
    for index in which:
        rule = scanner.rules[index]
        reach = -1  # this rule's last hidden byte: matches inside it were hidden with it
        for m in rule.regex.finditer(data):
            start, end = m.span(1) if rule.regex.groups and m.start(1) >= 0 else m.span()
            if end <= reach or not _accepted(rule, data, m, start, end):
                continue
            span = _widened(data, start, end)
            if span is not None:
                spans.append(span)
                reach = span[1]
    return _merged(spans)


def _accepted(rule: _Rule, data: bytes, m: Any, start: int, end: int) -> bool:
    if rule.not_next is not None:
        after = m.end() if rule.not_next_of == "match" else m.end(1)
        if after < len(data) and rule.not_next.fullmatch(data[after : after + 1]):
            return False
    return rule.accept is None or rule.accept(data[start:end], m)


def _widened(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The hidden span: trimmed of the delimiters around it, then to its token's end; None
    where it starts inside a longer word (see _ALNUM)."""
    while start < end and data[start] in _TRIM_START:
        start += 1
    while end > start and data[end - 1] in _TRIM_END:
        end -= 1
    if start == end or (start > 0 and data[start - 1] in _ALNUM):
        return None
    token_end = _TOKEN_RUN.match(data, end).end()  # type: ignore[union-attr]
    while token_end > end and data[token_end - 1] == 0x2E:  # a full stop after a token
        token_end -= 1
    value = data[start:token_end].decode("utf-8", "surrogatepass")
    return None if is_placeholder(value, metavar=True) else (start, token_end)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _encode(text: str) -> bytes:
    # surrogatepass: a workload's undecodable bytes (surrogateescape) come back as they were
    return text.encode("utf-8", "surrogatepass")


def hide_shapes(text: str) -> str:
    """``text`` with every credential known by its shape replaced by ``<redacted>``."""
    if len(text) < MIN_SHAPE_LEN:
        return text
    data = _encode(text)
    spans = _spans(data)
    if not spans:
        return text
    parts: list[bytes] = []
    done = 0
    for start, end in spans:
        parts += [data[done:start], REDACTED.encode()]
        done = end
    parts.append(data[done:])
    return b"".join(parts).decode("utf-8", "surrogatepass")


def shape_values(text: str) -> list[str]:
    """The credentials in ``text`` known by their shape (what :func:`hide_shapes` hides)."""
    if len(text) < MIN_SHAPE_LEN:
        return []
    data = _encode(text)
    values = (data[a:b].decode("utf-8", "surrogatepass") for a, b in _spans(data))
    return [v for v in values if REDACTED not in v]
