"""Secrets never reach the terminal, however the text is cut into writes.

Generated from tests/secret_shapes.py: every credential shape, written to the live echo of
``acceptrun run`` (:class:`acceptrun._util.controls.LiveEcho`) cut in two at every byte, and
every key block written a line per write to the echo and to the CLI's stream
(:class:`acceptrun._util.console.RedactingStream`), with flushes between; and every shape
as an argument of a command line (:func:`acceptrun._util.redact.redact_argv`). A progress
bar with no secret still reaches the terminal byte for byte, through a real pipe.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from acceptrun._util.console import RedactingStream
from acceptrun._util.controls import LiveEcho
from acceptrun._util.keyblock import BLOCK_MAX
from acceptrun._util.redact import REDACTED, redact_argv, redact_spec, redact_text
from acceptrun.cli.main import main
from acceptrun.record.workspace import Workspace
from campaign import tally
from secret_shapes import SHAPES

BLOCKS = [s for s in SHAPES if "-----BEGIN" in s.text]


def _through_a_pipe(chunks: list[bytes]) -> bytes:
    """What a terminal reading the pipe under a live echo gets for ``chunks``."""
    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader:
        with os.fdopen(w, "wb", buffering=0) as writer:
            echo = LiveEcho(writer)
            for chunk in chunks:
                echo.write(chunk)
                echo.flush()  # as the supervisor's tee does after each chunk
            echo.finish()
        return reader.read()


def _echo(chunks: list[bytes]) -> bytes:
    sink = io.BytesIO()
    echo = LiveEcho(sink)
    for chunk in chunks:
        echo.write(chunk)
        echo.flush()
    echo.finish()
    return sink.getvalue()


# A tqdm bar redrawn with \r, coloured log lines between its updates, a bar left without
# its newline at the end: no secret in it, so the terminal gets exactly these bytes.
TQDM = b"".join(
    b"\rtrain:  %3d%%|%s%s| %d/20 [00:%02d<00:%02d, 4.%dit/s, loss=0.%03d]"
    % (i * 5, "\u2588".encode() * i, b" " * (20 - i), i, i, 20 - i, i % 10, 999 - i)
    + (b"\n\x1b[32mINFO\x1b[0m eval at step %d: acc=0.%d\n" % (i, i) if i % 7 == 0 else b"")
    for i in range(21)
)


def test_a_progress_bar_without_a_secret_reaches_the_terminal_byte_for_byte() -> None:
    cases = [[TQDM]] + [[TQDM[:i], TQDM[i:]] for i in range(1, len(TQDM), 7)]
    cases += [[TQDM[i : i + 64] for i in range(0, len(TQDM), 64)]]  # a pipe's small reads
    for chunks in cases:
        assert _echo(chunks) == TQDM, chunks
    assert _through_a_pipe([TQDM[i : i + 100] for i in range(0, len(TQDM), 100)]) == TQDM
    tally("live echo", tried=len(cases) + 1)


def test_a_bar_s_update_is_shown_at_once_but_its_last_words() -> None:
    sink = io.BytesIO()
    echo = LiveEcho(sink)
    echo.write(b"\rtrain:  45%|#####     | 9/20 [00:09<00:11, 1.0it/s]")
    shown = sink.getvalue()
    assert shown == b"\rtrain:  45%|#####     | ", shown  # its last three words wait
    echo.finish()
    assert sink.getvalue().endswith(b"9/20 [00:09<00:11, 1.0it/s]")


def test_a_secret_cut_in_two_by_the_pipe_is_hidden() -> None:
    tried = leaks = 0
    for shape in SHAPES:
        data = f"step 10 loss=0.5\nstdout: {shape.text}\nafter it\n".encode()
        for i in range(1, len(data)):
            for shown in (_echo([data[:i], data[i:]]), _through_a_pipe([data[:i], data[i:]])):
                tried += 1
                leaks += shape.needle.encode() in shown
                assert shape.needle.encode() not in shown, (shape.family, data[:i])
                assert (
                    shown.startswith(b"step 10 loss=0.5\nstdout: ") and REDACTED.encode() in shown
                )
                assert shown.endswith(b"\nafter it\n"), (shape.family, shown)
    tally("live echo", tried=tried, secrets=leaks)


def test_a_key_block_written_a_line_per_write_is_hidden() -> None:
    tried = leaks = 0
    for shape in BLOCKS:
        lines = f"before\n{shape.text}\nafter\n".encode().splitlines(keepends=True)
        # The echo, a line per chunk; then each line cut in two as well.
        cases = [lines, [half for line in lines for half in (line[:5], line[5:])]]
        for chunks in cases:
            shown = _through_a_pipe(chunks)
            tried += 1
            leaks += shape.needle.encode() in shown
            assert shape.needle.encode() not in shown, shape.family
            assert (
                shown.startswith(b"before\n")
                and shown.endswith(b"after\n")
                and REDACTED.encode() in shown
            )
        # The CLI's stream, a print per line and a flush between (acceptrun logs).
        raw = io.StringIO()
        out = RedactingStream(raw)  # type: ignore[arg-type]
        for line in f"before\n{shape.text}\nafter\n".splitlines():
            print(line, file=out)
            out.flush()
        out.finish()
        tried += 1
        leaks += shape.needle in raw.getvalue()
        assert shape.needle not in raw.getvalue(), shape.family
        assert raw.getvalue().startswith("before\n") and raw.getvalue().endswith("after\n")
    tally("live echo", tried=tried, secrets=leaks)


def test_a_key_block_follows_the_end_of_another_on_its_line() -> None:
    text = " | ".join(s.text for s in BLOCKS)  # "-----END ...----- | -----BEGIN ...-----"
    raw = io.StringIO()
    out = RedactingStream(raw)  # type: ignore[arg-type]
    for line in f"raised: {text}\n".splitlines(keepends=True):
        out.write(line)
    out.finish()
    assert not [s.family for s in BLOCKS if s.needle in raw.getvalue()], raw.getvalue()
    assert raw.getvalue().startswith("raised: ")


def test_nothing_is_lost_at_the_end_of_the_stream() -> None:
    # Text without a secret, ending mid-word and mid-character: all of it comes out.
    data = "downloading 3 shards … done; über ✓".encode()
    for i in range(1, len(data)):
        assert _echo([data[:i], data[i:]]) == data
    # A key block cut short by the end: its BEGIN line and <redacted>, nothing of its body.
    (shape, *_) = BLOCKS
    cut = shape.text[: shape.text.index(shape.needle) + len(shape.needle)]
    shown = _echo([line.encode() for line in cut.splitlines(keepends=True)])
    assert shape.needle.encode() not in shown and shown.endswith(REDACTED.encode() + b"\n")
    raw = io.StringIO()
    out = RedactingStream(raw)  # type: ignore[arg-type]
    out.write(cut)
    out.flush()
    assert raw.getvalue() == ""  # held across a flush: a block is shown whole or not at all
    out.finish()
    assert shape.needle not in raw.getvalue() and raw.getvalue().endswith(REDACTED + "\n")


def test_what_is_held_is_bounded() -> None:
    begin = "-----BEGIN PRIVATE KEY-----\n"
    body = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw\n"
    raw = io.StringIO()
    out = RedactingStream(raw)  # type: ignore[arg-type]
    out.write(begin)
    for _ in range(BLOCK_MAX // len(body) + 2):
        out.write(body)
    # Past 64 KiB of body, the block is shown as its BEGIN line and <redacted>, without
    # waiting for the END line; the rest of its body is left out.
    assert raw.getvalue() == redact_text(begin) + REDACTED + "\n"
    out.write(body + "-----END PRIVATE KEY-----\nafter\n")
    out.finish()
    assert body.strip() not in raw.getvalue() and raw.getvalue().endswith("after\n")
    # The echo: a last word past 512 bytes is not held.
    long = b"x" * 600
    sink = io.BytesIO()
    LiveEcho(sink).write(b"word " + long)
    assert sink.getvalue() == b"word " + long


def test_every_shape_as_an_argument_is_hidden_and_options_keep_their_rule() -> None:
    tried = leaks = 0
    for shape in SHAPES:
        for argv in (
            ["train.py", shape.text],
            ["train.py", "--lr", shape.text],
            ["train.py", "--key", shape.text],
            ["train.py", f"--api-key={shape.text}"],
        ):
            shown = " ".join(redact_argv(argv))
            tried += 1
            leaks += shape.needle in shown
            assert shape.needle not in shown, (shape.family, argv[1:])
        spec = redact_spec({"name": "x", "command": ["python", "train.py", shape.text]})
        tried += 1
        leaks += shape.needle in str(spec)
        assert shape.needle not in str(spec), shape.family
    tally("command lines", tried=tried, secrets=leaks)
    kept = ["train.py", "--keyfile", "/keys/id_ed25519", "--max-new-tokens", "64", "--lr", "3e-4"]
    assert redact_argv(kept) == kept
    assert redact_argv(["t.py", "--token", "abc123", "--api-key=xyz"]) == [
        "t.py", "--token", REDACTED, f"--api-key={REDACTED}",
    ]  # fmt: skip


def test_logs_of_several_attempts_hide_a_key_block_behind_their_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[attempt N]`` before each line (several attempts, or --follow): a body line with a
    prefix is no body line to the CLI's stream, so show_logs holds each log's blocks."""
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run(
        "keys", spec_text='name = "keys"\ncommand = ["true"]\n', state={"status": "closed"}
    )
    text = "".join(f"before\n{s.text}\nafter\n" for s in BLOCKS)
    for n in (1, 2):
        record.attempt_dir(n).mkdir(parents=True)
        (record.attempt_dir(n) / "stdout.log").write_text(text)
        (record.attempt_dir(n) / "stderr.log").write_text(BLOCKS[0].text)  # no END: cut short
    rc = main(["--workspace", str(tmp_path / "ws"), "logs", record.run_id])
    out = capsys.readouterr().out
    leaks = [s.family for s in BLOCKS if s.needle in out]
    tally("live echo", tried=len(BLOCKS), secrets=len(leaks))
    assert rc == 0 and not leaks, out
    assert out.count("[attempt 1] before\n") == len(BLOCKS) and "[attempt 2] after\n" in out
    assert all(line.startswith("[attempt ") for line in out.splitlines()), out
