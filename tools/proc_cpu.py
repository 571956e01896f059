"""The CPU of every Python process a command starts, by kind of process: where a suite's time goes.

    python tools/proc_cpu.py install DIR     # every Python process of this venv logs to DIR
    make test-integration                    # or any command: the suite, one test, a run
    python tools/proc_cpu.py uninstall
    python tools/proc_cpu.py report DIR [--by test|kind] [--top N]

``install`` puts a ``.pth`` file into this interpreter's site-packages: at start-up every
Python process of the environment registers an exit hook that writes one JSON file to DIR:
its argv, CPU seconds (user + system, its own, not its children's), wall seconds, the test
that started it (``PYTEST_CURRENT_TEST``, inherited) and whether torch and
``torch._dynamo`` (a torch optimizer imports it when built: about as dear as torch
itself) were imported. A process that dies of a signal or ``os._exit`` runs no exit hook and is not
counted (a SIGKILLed attempt, a rank torchrun killed): ``make suite-cpu``, which counts
reaped children, has them; the difference between the two is those processes.

A diagnostic for a developer's machine; ``uninstall`` removes the hook. Nothing in the
suite or the product uses it.
"""

from __future__ import annotations

import argparse
import collections
import json
import site
import sys
from pathlib import Path
from typing import Any

from acceptrun.cli.main import command_in

PTH = "zz_acceptrun_proc_cpu.pth"
HOOK = """\
import atexit, json, os, resource, sys, time
_t0, _dir = time.time(), {directory!r}
def _dump():
    try:
        r = resource.getrusage(resource.RUSAGE_SELF)
        m = sys.modules
        doc = {{"pid": os.getpid(), "argv": sys.argv[:6], "cpu": r.ru_utime + r.ru_stime,
               "wall": time.time() - _t0, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
               "torch": "torch" in m, "dynamo": "torch._dynamo" in m}}
        with open(os.path.join(_dir, f"{{os.getpid()}}-{{int(_t0 * 1e6)}}.json"), "w") as f:
            json.dump(doc, f)
    except Exception:
        pass
if not getattr(sys, "_acceptrun_proc_cpu", False):  # once: a venv's lib64 -> lib repeats .pth files
    sys._acceptrun_proc_cpu = True
    atexit.register(_dump)
"""


def _site() -> Path:
    return Path(site.getsitepackages()[0])


def install(directory: Path, site_dir: Path | None = None) -> Path:
    """Write the hook into ``site_dir`` (default: this interpreter's site-packages)."""
    directory.mkdir(parents=True, exist_ok=True)
    hook = HOOK.format(directory=str(directory.resolve()))
    # A .pth line that starts with "import" is executed at start-up: one line, so exec, in
    # a dict of its own that the exit hook keeps as its globals.
    pth = (site_dir or _site()) / PTH
    pth.write_text(f"import sys; exec({hook!r}, {{}})\n")
    return pth


def uninstall(site_dir: Path | None = None) -> Path:
    pth = (site_dir or _site()) / PTH
    pth.unlink(missing_ok=True)
    return pth


def kind(doc: dict[str, Any]) -> str:
    """What a process was: an acceptrun command, torchrun's agent, a script by name, pytest."""
    argv = [str(a) for a in doc["argv"]]
    line = " ".join(argv)
    if "acceptrun/__main__.py" in line or (argv and argv[0].endswith("/acceptrun")):
        return f"acceptrun {command_in(argv[1:]) or '(help or a bad command line)'}"
    if "torch/distributed/run.py" in line:
        return "torchrun agent"
    if "capture/_probe.py" in line:
        return "provenance probe"
    if argv[:1] == ["-c"]:
        return "python -c (xdist workers among them)"
    if argv and (argv[0].endswith("pytest/__main__.py") or argv[0].endswith("/pytest")):
        return "pytest"
    return f"script {Path(argv[0]).name}" if argv else "python"


def load(directory: Path) -> list[dict[str, Any]]:
    """The processes logged in ``directory``."""
    docs = []
    for path in directory.glob("*.json"):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a process that died while writing
    return docs


def report(directory: Path, by: str, top: int) -> None:
    docs = load(directory)
    if not docs:
        sys.exit(f"{directory}: no process logged (is the hook installed? `install DIR`)")
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for doc in docs:
        key = (doc["test"].split(" ")[0] or "(no test)") if by == "test" else kind(doc)
        groups[key].append(doc)
    total = sum(d["cpu"] for d in docs)
    torch_cpu = sum(d["cpu"] for d in docs if d["torch"])
    print(f"{len(docs)} processes, {total:.0f} CPU-s; {sum(d['torch'] for d in docs)} imported "
          f"torch ({torch_cpu:.0f} CPU-s), {sum(d['dynamo'] for d in docs)} torch._dynamo")  # fmt: skip
    print(f"\n  CPU s  procs  torch  dynamo  CPU/proc  {by}")
    rows = sorted(groups.items(), key=lambda kv: -sum(d["cpu"] for d in kv[1]))
    for key, group in rows[:top]:
        cpu = sum(d["cpu"] for d in group)
        n_torch, n_dynamo = sum(d["torch"] for d in group), sum(d["dynamo"] for d in group)
        print(
            f"{cpu:7.1f} {len(group):6d} {n_torch:6d} {n_dynamo:7d} {cpu / len(group):9.2f}  {key}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("install").add_argument("directory", type=Path)
    sub.add_parser("uninstall")
    rep = sub.add_parser("report")
    rep.add_argument("directory", type=Path)
    rep.add_argument("--by", choices=("kind", "test"), default="kind")
    rep.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.action == "install":
        pth = install(args.directory)
        print(f"installed {pth}: the Python processes of {sys.prefix} log to {args.directory}")
    elif args.action == "uninstall":
        print(f"removed {uninstall()}")
    else:
        report(args.directory, args.by, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
