"""Pickle-free training state: round trips, bit-exact resume, staging, codec, security."""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from acceptrun.checkpoint.restore import load_into
from acceptrun.checkpoint.staging import (
    Staged,
    StagingBuffers,
    StateChangedDuringCopy,
    stage,
    write_staged,
)
from acceptrun.checkpoint.state import STATE, TENSORS
from acceptrun.errors import RecordError, UserError

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

VOCAB, DIM, STEPS = 11, 8, 10


class DirWriter:
    """The writer protocol at its smallest: plain files in a directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.opened: list[str] = []

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        self.opened.append(name)
        with open(self.path / name, "xb") as f:
            yield f


def save(objects: dict[str, Any], path: Path, **kwargs: Any) -> Path:
    write_staged(stage(objects, **kwargs), DirWriter(path))
    return path


class TinyLM(nn.Module):
    """Embedding tied to the output head, dropout, and a bf16 buffer updated in training."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("temperature", torch.tensor([1.0, 0.5], dtype=torch.bfloat16))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.temperature.mul_(1.01)
        h = self.drop(torch.relu(self.hidden(self.embed(tokens))))
        return self.head(h) / self.temperature[0].float()


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def make(init_seed: int, total_steps: int = STEPS) -> dict[str, Any]:
    torch.manual_seed(init_seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=total_steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
    return {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler}


def train_step(objs: dict[str, Any], step: int) -> None:
    """Data from the step number; dropout, noise and loss jitter from all three global RNGs."""
    data = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (4, 6), generator=data)
    targets = torch.randint(0, VOCAB, (4, 6), generator=data)
    jitter = 1 + 0.1 * random.random() + 0.1 * float(np.random.rand())
    logits = objs["model"](tokens) + 0.01 * torch.randn(4, 6, VOCAB)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) * jitter
    objs["optimizer"].zero_grad()
    objs["scaler"].scale(loss).backward()
    objs["scaler"].step(objs["optimizer"])
    objs["scaler"].update()
    objs["scheduler"].step()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Deep equality; tensors compared bit for bit (NaN and -0.0 included), dtype too."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(bits(a), bits(b)), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, path
    else:
        assert type(a) is type(b) and a == b, path


def test_round_trip_restores_every_object_bitwise(tmp_path: Path) -> None:
    seed_all(0)
    objs = make(init_seed=1)
    for step in range(3):
        train_step(objs, step)
    extra = {"epoch": 3, "best": float("inf"), "history": [0.5, 0.25]}
    before = {name: obj.state_dict() for name, obj in objs.items()}
    save({**objs, "extra": extra}, tmp_path / "ckpt")
    after_save = torch.rand(3)

    seed_all(99)
    fresh = make(init_seed=2)
    out = load_into(tmp_path / "ckpt", {**fresh, "extra": None})

    for name, obj in fresh.items():
        assert_same(before[name], obj.state_dict(), name)
    assert before["scaler"]["_growth_tracker"] == 3  # a CPU GradScaler with real state
    assert out["values"] == {"extra": extra}
    assert out["notes"] == []
    assert out["meta"]["torch_version"] == torch.__version__
    model = fresh["model"]
    assert model.head.weight is model.embed.weight  # still tied after loading both keys
    assert model.temperature.dtype == torch.bfloat16
    assert torch.equal(torch.rand(3), after_save)  # global torch RNG restored


@pytest.mark.parametrize("k", [0, 3, 7])
def test_bit_exact_resume_after_k_steps(tmp_path: Path, k: int) -> None:
    seed_all(123)
    straight = make(init_seed=1)
    for step in range(STEPS):
        train_step(straight, step)

    seed_all(123)
    first = make(init_seed=1)
    for step in range(k):
        train_step(first, step)
    save({**first, "extra": {"step": k}}, tmp_path / "ckpt")
    del first

    seed_all(456)  # a new process: other init, other global RNG state
    resumed = make(init_seed=2)
    out = load_into(tmp_path / "ckpt", {**resumed, "extra": None})
    for step in range(out["values"]["extra"]["step"], STEPS):
        train_step(resumed, step)

    for name, param in straight["model"].state_dict().items():
        assert torch.equal(param, resumed["model"].state_dict()[name]), name
    assert_same(straight["optimizer"].state_dict(), resumed["optimizer"].state_dict())
    assert_same(straight["scheduler"].state_dict(), resumed["scheduler"].state_dict())


def test_staged_copy_is_isolated_from_later_updates() -> None:
    seed_all(0)
    objs = make(init_seed=1)
    train_step(objs, 0)
    staged = stage(objs)
    snapshot = {k: v.clone() for k, v in staged.tensors.items()}
    for step in range(1, 3):
        train_step(objs, step)
    with torch.no_grad():
        for p in objs["model"].parameters():
            p.add_(1.0)
    for key, tensor in staged.tensors.items():
        assert torch.equal(bits(tensor), bits(snapshot[key])), key

    live = {t.untyped_storage().data_ptr() for t in objs["model"].state_dict().values()}
    live |= {
        t.untyped_storage().data_ptr()
        for s in objs["optimizer"].state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    }
    staged_ptrs = [t.untyped_storage().data_ptr() for t in staged.tensors.values()]
    assert len(set(staged_ptrs)) == len(staged_ptrs)  # tied weights: one copy per key
    assert not live & set(staged_ptrs)
    assert {"model/embed.weight", "model/head.weight"} <= set(staged.tensors)
    assert all(t.is_contiguous() and t.device.type == "cpu" for t in staged.tensors.values())
    assert staged.nbytes == sum(t.numel() * t.element_size() for t in staged.tensors.values())


def test_staging_buffers_are_reused_and_guarded(tmp_path: Path) -> None:
    model = nn.Linear(64, 64)
    buffers = StagingBuffers()
    first = stage({"model": model}, buffers=buffers, rng=False)
    ptr = first.tensors["model/weight"].data_ptr()
    with pytest.raises(RuntimeError, match="unwritten snapshot"):
        stage({"model": model}, buffers=buffers)
    write_staged(first, DirWriter(tmp_path / "a"))
    with torch.no_grad():
        model.weight.add_(1.0)
    second = stage({"model": model}, buffers=buffers, rng=False)
    assert second.tensors["model/weight"].data_ptr() == ptr  # same memory, new contents
    assert torch.equal(second.tensors["model/weight"], model.weight)
    assert buffers.nbytes == (64 * 64 + 64) * 4
    second.release()
    stage({"model": model}, buffers=buffers).release()


def test_files_load_with_the_safetensors_library(tmp_path: Path) -> None:
    square = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    values = {
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "f16": torch.randn(2, 3, dtype=torch.float16),
        "transposed": square.t(),  # not contiguous
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(5, dtype=torch.uint8),
    }
    writer = DirWriter(tmp_path / "ckpt")
    staged = stage({"extra": values}, rng=False)
    write_staged(staged, writer)
    assert writer.opened == [TENSORS, STATE]

    loaded = load_file(tmp_path / "ckpt" / TENSORS)
    assert set(loaded) == {f"extra/{k}" for k in values}
    for key, tensor in values.items():
        assert_same(tensor.contiguous(), loaded[f"extra/{key}"], key)
    with safe_open(tmp_path / "ckpt" / TENSORS, framework="pt") as f:
        assert f.metadata()["format"] == "pt"
    raw = (tmp_path / "ckpt" / TENSORS).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    assert header_len % 8 == 0 and raw[8 + header_len - 1 : 8 + header_len] in (b" ", b"}")
    out = load_into(tmp_path / "ckpt", {"extra": None}, rng=False)
    assert_same({k: v.contiguous() for k, v in values.items()}, out["values"]["extra"])


def test_codec_round_trips_json_awkward_values(tmp_path: Path) -> None:
    extra = {
        "nan": float("nan"),
        "inf": float("inf"),
        "-inf": float("-inf"),
        "-0": -0.0,
        "tiny": 5e-324,
        "big": 2**70,
        "pair": (1, (2.5, "x")),
        "int_keys": {3: "three", (1, 2): [None, True]},
        "looks_tagged": {"__tensor__": "not a tensor"},
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "np_scalar": np.float32(1.5),
        "dtype": torch.bfloat16,
        "device": torch.device("cuda", 1),
    }
    save({"extra": extra}, tmp_path / "ckpt", rng=False)

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    json.loads((tmp_path / "ckpt" / STATE).read_text(), parse_constant=refuse)
    out = load_into(tmp_path / "ckpt", {"extra": None}, rng=False)
    got = out["values"]["extra"]
    assert_same(
        {k: v for k, v in extra.items() if k != "np_scalar"},
        {k: v for k, v in got.items() if k != "np_scalar"},
    )
    assert str(got["-0"]) == "-0.0"
    assert isinstance(got["np_scalar"], np.float32) and got["np_scalar"] == 1.5


def test_rng_states_are_restored(tmp_path: Path) -> None:
    seed_all(5)
    save({"extra": 0}, tmp_path / "ckpt")
    expected = (random.random(), float(np.random.rand()), torch.rand(2))
    seed_all(6)
    load_into(tmp_path / "ckpt", {"extra": None})
    assert (random.random(), float(np.random.rand())) == expected[:2]
    assert torch.equal(torch.rand(2), expected[2])


def test_cuda_rng_is_skipped_with_a_note_on_a_machine_with_fewer_gpus(tmp_path: Path) -> None:
    save({"extra": 0}, tmp_path / "ckpt")
    state_file = tmp_path / "ckpt" / STATE
    meta = json.loads(state_file.read_text())
    # As if saved on an 8-GPU machine; the CPU RNG tensor stands in for the GPU states.
    meta["rng"]["cuda"] = {"device_count": 8, "states": [meta["rng"]["torch"]] * 8}
    state_file.write_text(json.dumps(meta))
    out = load_into(tmp_path / "ckpt", {"extra": None})
    assert (
        len(out["notes"]) == 1 and "CUDA RNG not restored: saved with 8 GPU(s)" in out["notes"][0]
    )


class WarmupFn:
    """A callable object: LambdaLR saves its __dict__, so its attributes must be data."""

    def __init__(self) -> None:
        self.fn = lambda step: min(1.0, (step + 1) / 10)

    def __call__(self, step: int) -> float:
        return float(self.fn(step))


def test_unsavable_state_raises_type_error_naming_the_key() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupFn())
    with pytest.raises(TypeError, match=r"scheduler/lr_lambdas\[0\]/fn: cannot save a function"):
        stage({"scheduler": sched})
    with pytest.raises(TypeError, match=r"extra/hooks\[1\]: cannot save a builtins.object"):
        stage({"extra": {"hooks": [1, object()]}})
    with pytest.raises(TypeError, match="sparse"):
        stage({"extra": torch.eye(2).to_sparse()})
    with pytest.raises(ValueError, match="object name"):
        stage({"a/b": 1})


def test_lambda_lr_with_a_plain_lambda_round_trips(tmp_path: Path) -> None:
    """torch leaves plain functions out of LambdaLR.state_dict(); the code rebuilds them."""

    def build() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)

    opt, sched = build()
    for _ in range(4):
        opt.step()
        sched.step()
    save({"optimizer": opt, "scheduler": sched}, tmp_path / "ckpt")
    opt2, sched2 = build()
    load_into(tmp_path / "ckpt", {"optimizer": opt2, "scheduler": sched2})
    assert sched2.get_last_lr() == sched.get_last_lr()
    sched.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    save({"extra": 1}, tmp_path / "ckpt")
    state_file = tmp_path / "ckpt" / STATE
    meta = json.loads(state_file.read_text())
    meta["format_version"] = 2
    state_file.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="format version 2 is not one this acceptrun reads"):
        load_into(tmp_path / "ckpt", {"extra": None})


def test_names_must_match_unless_not_strict(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    save({"model": model, "extra": 1}, tmp_path / "ckpt")
    with pytest.raises(UserError, match=r"names not in the checkpoint: \['optimizer'\]"):
        load_into(tmp_path / "ckpt", {"model": model, "extra": None, "optimizer": None})
    out = load_into(tmp_path / "ckpt", {"model": model}, strict=False)
    assert out["values"] == {"extra": 1} and "not strict" in out["notes"][0]
    with pytest.raises(RuntimeError, match="size mismatch") as info:
        load_into(tmp_path / "ckpt", {"model": nn.Linear(3, 2), "extra": None})
    assert "while loading 'model'" in "".join(getattr(info.value, "__notes__", []))


class Planted:
    """Unpickling this creates ``marker``: proof that a pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_planted_pickle_is_never_executed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = tmp_path / "control-marker"
    pickle.loads(pickle.dumps(Planted(control))).close()
    assert control.exists()  # the payload works when unpickled

    model = nn.Linear(2, 2)
    ckpt = save({"model": model}, tmp_path / "ckpt")
    marker = tmp_path / "marker"
    (ckpt / "extra.pkl").write_bytes(pickle.dumps(Planted(marker)))
    torch.save({"state": Planted(marker)}, ckpt / "model.pt")

    def no_pickle(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the load path unpickled something")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    load_into(ckpt, {"model": nn.Linear(2, 2)})

    (ckpt / TENSORS).write_bytes(pickle.dumps(Planted(marker)))  # a pickle where data belongs
    with pytest.raises(Exception, match="not a readable safetensors file"):
        load_into(ckpt, {"model": nn.Linear(2, 2)})
    assert not marker.exists()


def test_load_to_cpu_device(tmp_path: Path) -> None:
    model = nn.Linear(3, 3)
    save({"model": model}, tmp_path / "ckpt")
    fresh = nn.Linear(3, 3)
    load_into(tmp_path / "ckpt", {"model": fresh}, device="cpu")
    assert torch.equal(fresh.weight, model.weight)
    out = load_into(tmp_path / "ckpt", {"model": fresh}, device=torch.device("cpu"))
    assert out["notes"] == []


def test_staged_dataclass_shape() -> None:
    staged = stage({"extra": {"step": 1}}, rng=False)
    assert isinstance(staged, Staged)
    assert staged.tensors == {} and staged.nbytes == 0
    assert staged.meta["objects"]["extra"] == {"kind": "value", "state": {"step": 1}}
    assert staged.meta["format_version"] == 1 and staged.meta["rng"] is None


# ---------------------------------------------------------------------------------------
# CUDA: run where a GPU is present


@pytest.mark.gpu
@gpu
def test_cuda_checkpoint_loads_onto_cpu_and_back(tmp_path: Path) -> None:
    model = nn.Linear(16, 16).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step()
    buffers = StagingBuffers()
    staged = stage({"model": model, "optimizer": opt}, buffers=buffers)
    # Pinned where the source was on the GPU; CPU-side state (AdamW's step, RNG) is not.
    assert staged.tensors["model/weight"].is_pinned()
    assert staged.tensors["optimizer/state/0/exp_avg"].is_pinned()
    assert staged.meta["rng"]["cuda"]["device_count"] == torch.cuda.device_count()
    write_staged(staged, DirWriter(tmp_path / "ckpt"))

    cpu_model = nn.Linear(16, 16)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters())
    load_into(tmp_path / "ckpt", {"model": cpu_model, "optimizer": cpu_opt}, device="cpu")
    assert torch.equal(cpu_model.weight, model.weight.cpu())
    assert cpu_opt.state_dict()["state"][0]["exp_avg"].device.type == "cpu"

    save({"model": cpu_model, "optimizer": cpu_opt}, tmp_path / "from-cpu")
    gpu_model = nn.Linear(16, 16).cuda()
    gpu_opt = torch.optim.AdamW(gpu_model.parameters())
    load_into(tmp_path / "from-cpu", {"model": gpu_model, "optimizer": gpu_opt}, device="cuda")
    assert torch.equal(gpu_model.weight, model.weight)
    assert gpu_opt.state_dict()["state"][0]["exp_avg"].device.type == "cuda"


@pytest.mark.gpu
@gpu
def test_cuda_staging_is_isolated_and_rng_restored(tmp_path: Path) -> None:
    torch.cuda.manual_seed_all(3)
    weight = torch.randn(1024, 1024, device="cuda")
    original = weight.cpu()
    staged = stage({"extra": {"w": weight}}, buffers=StagingBuffers())
    expected = torch.rand(8, device="cuda")
    weight.add_(1.0)  # queued after the copy on the same stream; the snapshot keeps the old
    assert torch.equal(staged.tensors["extra/w"], original)
    write_staged(staged, DirWriter(tmp_path / "ckpt"))
    torch.cuda.manual_seed_all(4)
    load_into(tmp_path / "ckpt", {"extra": None})
    assert torch.equal(torch.rand(8, device="cuda"), expected)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("k", [2, 6])
def test_cuda_bit_exact_resume_with_dropout(tmp_path: Path, k: int) -> None:
    def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
        model = model.cuda()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(16, 32, device="cuda", generator=g)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    torch.manual_seed(0)
    straight = build(1)
    for i in range(8):
        step(*straight, i)

    torch.manual_seed(0)
    first = build(1)
    for i in range(k):
        step(*first, i)
    save({"model": first[0], "optimizer": first[1]}, tmp_path / "ckpt", buffers=StagingBuffers())
    torch.manual_seed(7)
    resumed = build(2)
    load_into(tmp_path / "ckpt", {"model": resumed[0], "optimizer": resumed[1]}, device="cuda")
    for i in range(k, 8):
        step(*resumed, i)
    for a, b in zip(straight[0].parameters(), resumed[0].parameters(), strict=True):
        assert torch.equal(a, b)


def test_plain_state_saves_and_loads_where_torch_cannot_be_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload without torch (numpy, JAX's host copies, an inference loop) checkpoints.

    ``None`` in sys.modules makes ``import torch`` fail, as where torch is not installed:
    saving and loading plain values and numpy arrays must not need it.
    """
    monkeypatch.setitem(sys.modules, "torch", None)
    history: list[float] = [0.5]
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    random.seed(7)
    path = save({"extra": {"epoch": 3, "best": float("inf")}, "history": history,
                 "table": table}, tmp_path / "ck")  # fmt: skip
    meta = json.loads((path / STATE).read_text())
    assert meta["torch_version"] is None and meta["rng"]["torch"] is None
    assert meta["tensors"]["count"] == 0
    expected = random.random()
    random.seed(99)
    history.clear()
    out = load_into(path, {"extra": None, "history": None, "table": None})
    assert random.random() == expected  # the Python RNG came back without torch
    assert out["values"]["extra"] == {"epoch": 3, "best": float("inf")}
    assert out["values"]["history"] == [0.5]
    assert np.array_equal(out["values"]["table"], table)
    assert out["values"]["table"].dtype == np.float32


def test_a_damaged_tensor_file_of_a_plain_state_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    path = save({"extra": {"epoch": 3}}, tmp_path / "ck")
    good = (path / TENSORS).read_bytes()
    for damaged in (good[:5], good + b"x", good[:8] + b"{" * (len(good) - 8)):
        (path / TENSORS).write_bytes(damaged)
        with pytest.raises(RecordError, match="not a readable safetensors file"):
            load_into(path, {"extra": None})
    (path / TENSORS).unlink()
    with pytest.raises(RecordError, match="is missing"):
        load_into(path, {"extra": None})


ALL_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
    *(d for d in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64",
      "float8_e4m3fn", "float8_e5m2")) if isinstance(d, torch.dtype)),
]  # fmt: skip


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> Any:
    raw = torch.randint(0, 256, (int(np.prod(shape)) * dtype.itemsize,), generator=gen)
    t = raw.to(torch.uint8).view(dtype).reshape(shape)
    return t if dtype != torch.bool else t.to(torch.uint8).remainder(2).to(torch.bool)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_our_reader_reads_what_the_safetensors_library_writes_bit_for_bit(
    tmp_path: Path, seed: int
) -> None:
    """The loader reads the safetensors format itself (no package a save did not need):
    a file the library wrote, of every dtype this torch has, in shapes with zeros and
    scalars, comes back with the same bytes, through load_into as a checkpoint."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    shapes = [(), (0,), (3,), (2, 0, 4), (5, 7), (1, 1, 3)]
    tensors = {
        f"extra/{str(d).removeprefix('torch.')}_{i}": _random_tensor(d, shapes[(i + seed) % 6], gen)
        for i, d in enumerate(ALL_DTYPES)
    }
    # state.json from our own save of the same tensors; the tensor file from the library
    ours = save({"extra": {k.removeprefix("extra/"): v for k, v in tensors.items()}},
                tmp_path / "ck", rng=False)  # fmt: skip
    save_file(tensors, str(ours / TENSORS), metadata={"format": "pt"})
    out = load_into(ours, {"extra": None}, rng=False)["values"]["extra"]
    for key, want in tensors.items():
        got = out[key.removeprefix("extra/")]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert (
            got.reshape(-1).view(torch.uint8).tolist()
            == want.reshape(-1).view(torch.uint8).tolist()
        ), key


def _header_file(path: Path, header: Any, data: bytes = b"", raw: bytes | None = None) -> None:
    text = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


@pytest.mark.parametrize(
    ("header", "data", "why"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"1234", "file at"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"12345678", "bytes for"),
        ({"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"12345678", "unknown"),
        ({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"", "shape"),
        ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [4, 2]}}, b"1234", "offsets"),
        ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
          "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"123", "starts at"),
        ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, b"1234", "starts at"),
        ([1, 2], b"", "not a JSON object"),
        ({"__metadata__": {"k": 3}}, b"", "__metadata__"),
        ({"a": "F32"}, b"", "not an object"),
    ],
)  # fmt: skip
def test_a_tensor_file_that_breaks_the_format_is_refused_naming_the_rule(
    tmp_path: Path, header: Any, data: bytes, why: str
) -> None:
    path = save({"extra": {"w": torch.ones(2)}}, tmp_path / "ck", rng=False)
    _header_file(path / TENSORS, header, data)
    with pytest.raises(RecordError, match="not a readable safetensors file") as err:
        load_into(path, {"extra": None}, rng=False)
    assert why in str(err.value)


def test_a_header_longer_than_the_file_is_refused_unread(tmp_path: Path) -> None:
    path = save({"extra": {"w": torch.ones(2)}}, tmp_path / "ck", rng=False)
    (path / TENSORS).write_bytes((1 << 60).to_bytes(8, "little") + b"{}")
    with pytest.raises(RecordError, match="a header of"):
        load_into(path, {"extra": None}, rng=False)


def test_a_checkpoint_restores_where_the_safetensors_package_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The install that can save can restore: with ``safetensors`` unimportable (None in
    sys.modules, as where it is not installed) a model and its optimizer come back
    bit for bit."""
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    model = nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    path = save({"model": model, "optimizer": opt}, tmp_path / "ck")
    other = nn.Linear(4, 3)
    other_opt = torch.optim.Adam(other.parameters())
    load_into(path, {"model": other, "optimizer": other_opt})
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(
        opt.state_dict()["state"][0]["exp_avg"], other_opt.state_dict()["state"][0]["exp_avg"]
    )


def test_a_restore_hashes_the_tensors_as_it_reads_them(tmp_path: Path) -> None:
    """One pass: the store leaves TENSORS' hash to the loader, which checks it before
    any object changes; a flipped byte is caught there, and nothing is loaded."""
    from acceptrun.checkpoint.store import CheckpointStore
    from acceptrun.checkpoint.tensorfile import TensorsHashMismatch

    seed_all(0)
    objs = make(init_seed=1)
    train_step(objs, 0)
    before = {name: obj.state_dict() for name, obj in objs.items()}
    store = CheckpointStore(tmp_path / "store")
    writer = store.begin(5)
    write_staged(stage(objs), writer)
    store.commit(writer)
    info = store.get(5)
    assert info is not None
    expect = str(info.files[TENSORS]["hash"])

    result = store.verify(5, defer=[TENSORS])
    assert result.ok and result.deferred == (TENSORS,)
    assert result.checked_bytes == info.files[STATE]["size"]  # the tensors were not read
    fresh = make(init_seed=2)
    load_into(info.path, fresh, expect=expect)
    for name, obj in fresh.items():
        assert_same(before[name], obj.state_dict(), name)

    data = bytearray((info.path / TENSORS).read_bytes())
    data[-1] ^= 1  # a bit of the last tensor's last byte
    (info.path / TENSORS).write_bytes(bytes(data))
    assert store.verify(5, defer=[TENSORS]).ok  # left to the loader, which catches it:
    untouched = make(init_seed=3)
    kept = {name: obj.state_dict() for name, obj in untouched.items()}
    with pytest.raises(TensorsHashMismatch, match=r"wrong hash .* nothing was loaded"):
        load_into(info.path, untouched, expect=expect)
    for name, obj in untouched.items():
        assert_same(kept[name], obj.state_dict(), name)
    full = store.verify(5)  # the full check names the file
    assert not full.ok and any(TENSORS in p and "wrong hash" in p for p in full.problems)


# ---- overlapped staging: what is left to the background copy, and its guard -----------------


def _bn_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_deferred_staging_leaves_only_what_an_optimizer_step_changes() -> None:
    model, opt = _bn_model()
    objects = {"model": model, "optimizer": opt, "extra": {"t": torch.ones(3)}}
    staged = stage(objects, buffers=StagingBuffers(), defer=True)
    params = {f"model/{n}" for n, _ in model.named_parameters()}
    moments = {k for k in staged.tensors if k.startswith("optimizer/state/")}
    assert moments and set(staged.pending) == params | moments
    # running statistics (a forward changes them), other objects and RNG: copied now
    copied = set(staged.tensors) - set(staged.pending)
    assert {"model/1.running_mean", "model/1.running_var", "extra/t"} <= copied
    with pytest.raises(RuntimeError, match="not copied yet"):
        write_staged(staged, DirWriter(Path("/nonexistent")))
    # without an optimizer nothing changes only in a step: everything is copied in the call
    alone = stage({"model": model}, buffers=StagingBuffers(), defer=True)
    assert alone.pending == {}
    alone.release()


def test_the_background_copy_is_the_state_of_the_call(tmp_path: Path) -> None:
    model, opt = _bn_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    staged = stage({"model": model, "optimizer": opt}, buffers=StagingBuffers(), defer=True)
    assert staged.copy_pending() >= 0 and staged.pending == {}
    with torch.no_grad():  # after the copy: the snapshot keeps the state of the call
        for p in model.parameters():
            p.add_(1)
    write_staged(staged, DirWriter(tmp_path))
    fresh, fresh_opt = _bn_model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_into(tmp_path, {"model": fresh, "optimizer": fresh_opt})
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_tensor_changed_before_its_copy_fails_the_snapshot_naming_it() -> None:
    model, opt = _bn_model()
    staged = stage({"model": model, "optimizer": opt}, buffers=StagingBuffers(), defer=True)
    with torch.no_grad():
        model[2].bias.mul_(2)  # in place, outside the optimizer, before the copy
    with pytest.raises(StateChangedDuringCopy, match=r"'model/2\.bias'.*staging = \"block\""):
        staged.copy_pending()
    staged.release()


def test_a_restore_keeps_nothing_of_the_file_mapped(tmp_path: Path) -> None:
    """The module's tensors are copied out of a memory map of the file; whatever an object
    keeps (the optimizer's state, a plain value) is its own memory: the file changed in
    place after the load changes none of it."""
    model, opt = _bn_model()
    extra = {"t": torch.arange(6.0)}
    staged = stage({"model": model, "optimizer": opt, "extra": extra}, buffers=StagingBuffers())
    write_staged(staged, DirWriter(tmp_path))
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state.items()}
    fresh, fresh_opt = _bn_model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    out = load_into(tmp_path, {"model": fresh, "optimizer": fresh_opt, "extra": None})
    path = tmp_path / TENSORS
    size = path.stat().st_size
    with open(path, "r+b") as f:  # every data byte changed, in place: the same inode
        f.seek(size // 4)
        f.write(b"\xff" * (size - size // 4))
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, saved_model[key]), key
    for (_, state), (_, before) in zip(fresh_opt.state.items(), saved_opt.items(), strict=True):
        for key, value in state.items():
            assert torch.equal(value, before[key]), key
    assert torch.equal(out["values"]["extra"]["t"], torch.arange(6.0))
