"""Watched checkpoints in their true order: dated again in a chain, retained by commit, never a reused step.

On real files and a real store, with the watcher's passes called in the order a run makes
them and the steps a script's TensorBoard writer reported given as the step events the
supervisor would have read by then; TensorBoard files written with tensorboard's own
writer. What each test pins failed before the change it names.
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.redating import redate_in_order
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.supervisor.axis import StepAxis
from acceptrun.supervisor.external import CheckpointWatcher
from campaign import tally
from conftest import Project

SEEDS, STEPS = 10, 60  # random runs, of so many operations each
OPS = ("train", "train", "save", "save", "scan", "scan", "flush", "flush", "kill")
BASE = time.time() - 1e6  # unix s: the synthetic clock of the steps and the files' mtimes


def watched_spec(project: Project, keep_last: int = 2, watch: str = "out/ckpt.json") -> RunSpec:
    path = project.spec(
        "print('never run')\n",
        extra=f"""
[checkpoint]
watch = ["{watch}"]
keep_last = {keep_last}
settle = "0.1s"
[progress]
tensorboard = "tb"
""",
    )
    return load_spec(path)


class Script:
    """A script's saves (out/*.json, mtimes on the synthetic clock) and its reported steps."""

    def __init__(self, spec: RunSpec, root: Path) -> None:
        self.spec, self.root = spec, root
        self.work = spec.workdir_path
        (self.work / "out").mkdir(exist_ok=True)
        self.events: list[dict[str, Any]] = []  # what the supervisor has read so far
        self.seen: list[tuple[str, Any]] = []

    def watcher(self, attempt: int = 1, resume_step: int | None = None) -> CheckpointWatcher:
        self.events = []
        w = CheckpointWatcher(
            self.spec, self.root, attempt=attempt, pid=os.getpid(),
            events=lambda: self.events, on_event=lambda k, f: self.seen.append((k, f)),
            resume_step=resume_step, axis=StepAxis(attempt, resume_step),
        )  # fmt: skip
        w.note_existing()
        return w

    def save(self, name: str, content: Any, t: float) -> None:
        path = self.work / "out" / name
        path.write_text(json.dumps({"content": content}))
        os.utime(path, (BASE + t, BASE + t))

    def report(self, step: int, t: float) -> None:
        self.events.append({"kind": "step", "step": step, "t": BASE + t, "source": "tensorboard"})


def held(store: CheckpointStore) -> dict[int, Any]:
    """Step -> what the capture holds, for every committed checkpoint."""
    out = {}
    for info in store.list():
        (name,) = [n for n in info.files if n.startswith("files/")]
        out[info.step] = json.loads((info.path / name).read_text())["content"]
    return out


def commit(store: CheckpointStore, step: int) -> None:
    writer = store.begin(step)
    writer.write_bytes("w.bin", str(step).encode())
    store.commit(writer)


def test_retention_keeps_the_newest_commits_not_the_highest_steps(tmp_path: Path) -> None:
    """Steps 100, 200, then 10 (a counter that went back): keep_last = 2 keeps 200 and 10.

    Ordered by step, LATEST (step 10) pinned "itself and every higher step": three kept.
    """
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (100, 200, 10):
        commit(store, step)
    assert sorted(i.step for i in store.list()) == [10, 200]
    assert [i.step for i in store.ordered()] == [200, 10]
    assert store.latest() is not None and store.latest().step == 10
    assert store.latest_verified() is not None and store.latest_verified().step == 10
    assert store.taken(100) and store.next_free_step() == 201  # deleted, never used again


def test_redate_in_order_moves_the_newest_first(tmp_path: Path) -> None:
    """1 -> 500 while 500 -> 1000: done from the free end; a deleted step is never taken."""
    store = CheckpointStore(tmp_path, keep_last=3)
    for step in (7, 1, 500):
        commit(store, step)
    done, failed = redate_in_order(store, {1: (500, {}), 500: (1000, {}), 7: (8, {})})
    assert not failed and sorted(i.step for i in done.values()) == [8, 500, 1000]
    assert [i.step for i in store.ordered()] == [8, 500, 1000]  # the commits' order kept
    commit(store, 2000)  # retention deletes step 8
    assert store.taken(8)
    done, failed = redate_in_order(store, {500: (8, {})})
    assert done == {} and failed == {} and store.get(500) is not None


def test_a_deleted_step_is_never_taken_by_another_capture(project: Project, tmp_path: Path) -> None:
    """Before, a capture named ckpt-100 after retention deleted step 100 was stored as 100."""
    spec = watched_spec(project, watch="out/ckpt-*.json")
    script = Script(spec, tmp_path / "store")
    w = script.watcher()
    for n, step in enumerate((100, 200, 300)):
        script.save(f"ckpt-{step}.json", n, t=step)
        w.stop(final=True)  # the final pass: captures what changed, as after a clean exit
    (script.work / "out" / "ckpt-100.json").unlink()
    script.save("ckpt-100.json", "again", t=400)  # another save the name dates at 100
    w.stop(final=True)
    assert held(w.store) == {300: 2, 301: "again"}
    assert w.store.taken(100) and w.store.taken(200)


def test_tensorboard_captures_dated_again_in_a_chain(project: Project, tmp_path: Path) -> None:
    """Scalars and saves every 500 steps, the scalars read late: no capture stays one behind.

    Before, the capture of step 500 stayed at its estimate: step 500 was held by the next
    capture, dated 500 itself until step 1000 was read, and ``_redate`` skipped it.
    """
    spec = watched_spec(project, keep_last=5)
    script = Script(spec, tmp_path / "store")
    w = script.watcher()
    for step in (500, 1000, 1500):
        script.save("ckpt.json", step, t=step + 0.5)  # saved right after its scalar...
        w._scan(final=None)  # a live pass: the JSON file proves itself whole
        script.report(step, t=step)  # ...which the supervisor reads after the capture
    w._redate()  # a pass once step 1500 is read: step 500's and 1000's captures proven
    assert held(w.store)[500] == 500 and held(w.store)[1000] == 1000
    script.report(2000, t=2000)
    w.stop(final=True)
    assert held(w.store) == {500: 500, 1000: 1000, 1500: 1500}
    redated = [f for k, f in script.seen if k == "checkpoint_redated"]
    assert {f["step"] for f in redated} >= {500, 1000, 1500}


def test_a_save_stamped_a_clock_tick_before_its_scalar_is_dated_by_that_scalar(
    project: Project, tmp_path: Path
) -> None:
    """Log, then save within the same tick: the file's coarse mtime can read earlier.

    Linux stamps a new file from its coarse clock (one tick, 4 ms at HZ=250), so a save
    made right after its scalar can carry an mtime 3 ms before the scalar's own time.
    Before, the scalar then counted as logged after the save: the capture was "proven" to
    hold the step before, took that step, and a chain of later captures stayed behind.
    """
    from acceptrun.supervisor.dating import FILE_TIME_SLACK_S

    early = FILE_TIME_SLACK_S * 0.75  # the mtime this much before the scalar's time
    spec = watched_spec(project, keep_last=5)
    script = Script(spec, tmp_path / "store")
    w = script.watcher()
    for step in (500, 1000, 1500):
        script.report(step, t=step)
        script.save("ckpt.json", step, t=step - early)
        w._scan(final=None)
        w._redate()
    script.report(2000, t=2000)
    w.stop(final=True)
    assert held(w.store) == {500: 500, 1000: 1000, 1500: 1500}


@pytest.mark.parametrize(
    ("tag", "loss"),
    [
        ("loss", True), ("Loss", True), ("train/loss", True), ("Loss/train", True),
        ("train_loss", True), ("training-loss", True), ("train_loss_step", True),
        ("Train Loss", True), ("val/loss", False), ("Loss/val", False), ("eval_loss", False),
        ("train_loss_epoch", False), ("lr", False), ("lossy", False),
    ],
)  # fmt: skip
def test_a_tensorboard_tag_is_the_loss_by_its_words(tag: str, loss: bool) -> None:
    from acceptrun.supervisor.progress import is_loss_tag

    assert is_loss_tag(tag) is loss


def tb_file(folder: Path, scalars: list[tuple[int, float, str]]) -> None:
    """Write (step, wall time, tag) scalars to a new event file, as SummaryWriter does."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2  # type: ignore[import-untyped]
    from tensorboard.summary.writer.event_file_writer import (  # type: ignore[import-untyped]
        EventFileWriter,
    )

    writer = EventFileWriter(str(folder))
    for step, wall, tag in scalars:
        value = summary_pb2.Summary.Value(tag=tag, simple_value=0.5)
        summary = summary_pb2.Summary(value=[value])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
    writer.close()


def read_tb(folder: Path, axis: StepAxis | None) -> Callable[[], list[tuple[int, dict[str, Any]]]]:
    """A poll of a TensorBoard reader opened now (an attempt's start) over ``folder``."""
    pytest.importorskip("tensorboard")
    from acceptrun.supervisor.progress import _TensorBoard

    given = {} if axis is None else {"axis": axis}
    reader = _TensorBoard.open(folder, {}, lambda message: None, **given)
    assert reader is not None
    return lambda: [(s, v) for s, _, v in reader.poll(time.time(), final=True)]


def test_loss_train_tag_gives_the_loss(tmp_path: Path) -> None:
    """Before, only a tag whose last part was "loss" was taken as the loss: Loss/train gave none."""
    poll = read_tb(tmp_path, None)
    now = time.time()
    tb_file(tmp_path, [(10, now, "Loss/train"), (10, now, "Loss/val"), (20, now, "Loss/train")])
    assert [(s, v.get("loss")) for s, v in poll()] == [(10, 0.5), (20, 0.5)]


@pytest.mark.parametrize(("after_s", "offset"), [(4.0, 500), (0.2, 0)])
def test_a_restarted_counter_whose_first_scalar_is_the_resumed_step(
    tmp_path: Path, after_s: float, offset: int
) -> None:
    """Resumed from 500, the first scalar is step 500: by wall time, a restart or not.

    Attempt 1 took 0.01 s a step (5 s for 500 steps). Step 500 logged 4 s after the new
    writer started is a counter that started again (offset by 500); 0.2 s after, one
    that went on. Before, neither was offset: attempt 2's saves were stored 500 low.
    """
    old = time.time() - 100
    tb_file(tmp_path, [(s, old + s * 0.01, "loss") for s in range(0, 501, 100)])
    axis = StepAxis(2, 500)
    poll = read_tb(tmp_path, axis)
    start = time.time()
    tb_file(tmp_path, [(500, start + after_s, "loss"), (1000, start + 2 * after_s, "loss")])
    assert [s for s, _ in poll()] == [500, 1000]
    assert axis.run_step(500, "tensorboard") == 500 + offset


class Reference:
    """The true order of one random run's saves, and what each store must then hold."""

    def __init__(self, script: Script, keep: int, seed: int) -> None:
        self.script, self.keep, self.seed = script, keep, seed
        self.truth: dict[str, int] = {}  # a save's content -> the step its script reported
        self.true_of: dict[str, int] = {}  # ... -> the step it holds on the run's own count
        self.written: dict[str, float] = {}  # ... -> its mtime on the synthetic clock
        self.clean: dict[str, bool] = {}  # no earlier save reported its step
        self.provable: dict[str, bool] = {}
        self.ever: list[str] = []  # contents seen in the store, in save order
        self.retired: dict[int, str] = {}  # step -> the content that held it when deleted
        self.last: dict[str, int] = {}

    def check(self, store: CheckpointStore) -> None:
        """``keep_last`` exact, in save order; no step a deleted capture held reused."""
        now = {c: s for s, c in held(store).items()}
        self.ever += sorted(set(now) - set(self.ever), key=lambda c: int(c.split("-")[0]))
        for content in set(self.ever) - set(now):
            self.retired.setdefault(self.last[content], content)
        self.last.update(now)
        order = [held(store)[i.step] for i in store.ordered()]
        assert order == self.ever[-len(order) :], self.seed
        assert len(order) == min(self.keep, len(self.ever)), self.seed
        for s, content in self.retired.items():
            assert now.get(content) in (None, s) and s not in held(store), (self.seed, s)

    def end_of_attempt(self, store: CheckpointStore) -> int:
        """Every kept capture proven by now holds its step; how many were checked."""
        read = self.script.events
        for content, s in self.truth.items():
            mtime = BASE + self.written[content]
            self.provable.setdefault(content, any(e["step"] == s for e in read) and any(
                e["t"] > mtime for e in read
            ))  # fmt: skip
        exact = [
            (s, c) for s, c in held(store).items() if self.provable[c] and self.clean[c]
        ]  # fmt: skip
        assert all(s == self.truth[c] for s, c in exact), (self.seed, exact)
        return len(exact)


def random_run(
    spec: RunSpec, root: Path, seed: int, ops: collections.Counter[str]
) -> tuple[collections.Counter[str], int]:
    """One random run (the test below); the watchers' events and the captures checked."""
    rng = random.Random(seed)
    script = Script(spec, root)
    ref = Reference(script, spec.checkpoint.keep_last, seed)
    true_step, base, clock, saved, n, proven = 0, 0, 0.0, -1, 0, 0
    unread: list[tuple[int, float]] = []
    w = script.watcher()
    for _ in range(STEPS):
        op = rng.choice(OPS)
        ops[op] += 1
        if op == "train":
            for _ in range(rng.randint(1, 3)):
                true_step, clock = true_step + 100, clock + 1.0
                unread.append((true_step - base, clock))
        elif op == "save" and true_step - base > saved:
            saved, content = true_step - base, f"{n}-{true_step}"
            ref.clean[content] = saved not in ref.truth.values()
            ref.truth[content], ref.true_of[content] = saved, true_step
            ref.written[content] = clock + 0.001
            n += 1
            script.save("ckpt.json", content, t=ref.written[content])
        elif op == "flush":
            for s, when in unread:
                script.report(s, when)
            unread = []
        elif op == "scan":
            w._scan(final=None)
        elif op == "kill":
            w.stop(final=False, why_not="killed")
            proven += ref.end_of_attempt(w.store)
            ref.check(w.store)
            unread = []  # a killed writer's unflushed scalars are lost
            resume = w.store.latest_verified(quarantine=False)
            true_step = ref.true_of[held(w.store)[resume.step]] if resume else 0
            base = rng.choice([0, true_step])  # its counter goes on, or starts again
            saved = true_step - base
            w = script.watcher(w.attempt + 1, resume.step if resume else None)
        ref.check(w.store)
    for s, when in unread:
        script.report(s, when)
    w.stop(final=True)
    proven += ref.end_of_attempt(w.store)
    ref.check(w.store)
    return collections.Counter(kind for kind, _ in script.seen), proven


def test_random_captures_kills_and_restarts_keep_the_true_order(
    project: Project, tmp_path: Path
) -> None:
    """Random runs against a reference model of the true order.

    A script logs a scalar every 100 steps and saves right after some of them; the
    supervisor reads the scalars late (a flush), captures on its passes, and the script
    is killed (its unread scalars lost) and resumed from the newest capture that
    verifies, its counter going on or starting again from 0 unnoticed (so steps go
    back); retention deletes. After every operation: exactly the newest ``keep_last``
    captures are kept, in the order they were saved; no step a deleted capture held is
    held by another. At the end of each attempt: every capture whose scalar and a later
    one were read, and whose step no earlier save claimed, is stored under its step.
    """
    ops = collections.Counter[str]()
    seen = collections.Counter[str]()
    proven = 0
    for seed in range(SEEDS):
        spec = watched_spec(project, keep_last=2 + seed % 2)
        events, checked = random_run(spec, tmp_path / f"store-{seed}", seed, ops)
        seen += events
        proven += checked
    # Every operation was tried, captures were re-dated, and many were checked exactly.
    assert set(ops) == set(OPS) and sum(ops.values()) == SEEDS * STEPS, ops
    assert seen["checkpoint_redated"] >= SEEDS and proven >= SEEDS // 2, (seen, proven)
    tally("watched checkpoint order", tried=sum(ops.values()))


@pytest.mark.parametrize("shape", ["fifo", "link", "directory", "garbage"])
def test_a_commit_log_that_is_not_a_file_never_hangs_a_save(tmp_path: Path, shape: str) -> None:
    """COMMITS made a FIFO, a link or a directory: the save fails naming it, at once;
    lines that are not commit records are skipped."""
    from acceptrun.checkpoint.sequence import COMMITS
    from acceptrun.errors import RecordError

    store = CheckpointStore(tmp_path / "ckpt", keep_last=2)
    commit(store, 5)
    log = tmp_path / "ckpt" / COMMITS
    log.unlink()
    secret = tmp_path / "elsewhere"
    secret.write_text('{"seq": 9, "step": 77}\n')
    if shape == "fifo":
        os.mkfifo(log)
    elif shape == "link":
        log.symlink_to(secret)
    elif shape == "directory":
        log.mkdir()
    else:
        log.write_bytes(b'\xff\x00 not json\n{"seq": "x", "step": 1}\n{"seq": 2, "step": 3}\n')
    assert not store.taken(77)  # a link is never read
    if shape == "garbage":
        commit(store, 6)
        assert store.taken(3) and [i.step for i in store.ordered()] == [5, 6]
        return
    with pytest.raises(RecordError, match="COMMITS: the checkpoint store's commit log"):
        commit(store, 6)
    assert [i.step for i in store.list()] == [5]
    assert secret.read_text() == '{"seq": 9, "step": 77}\n'
