"""``acceptrun env`` (provenance, and its diff between runs) and ``acceptrun data`` (manifests)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import file_arg, path_arg, text
from acceptrun._util.console import get_logger
from acceptrun.cli.record import add_run_argument, open_run

__all__ = ["register"]

_log = get_logger(__name__)
_say = _log.info


def cmd_env(args: argparse.Namespace) -> int:
    from acceptrun.capture import provenance

    prov = provenance.capture()
    print(
        json.dumps(prov, indent=2, sort_keys=True)
        if args.json
        else provenance.format_provenance(prov)
    )
    return 0


def cmd_env_diff(args: argparse.Namespace) -> int:
    from acceptrun.capture import provenance
    from acceptrun.errors import RecordError

    provs = []
    for ref in (args.run_a, args.run_b):
        rec = open_run(args, ref)
        prov = rec.read_json("provenance.json")
        if prov is None:
            raise RecordError(
                f"run {rec.run_id} has no provenance.json (it stopped before preflight)"
            )
        provs.append(prov)
    print(provenance.format_diff(provenance.diff(provs[0], provs[1])))
    return 0


def cmd_data_snapshot(args: argparse.Namespace) -> int:
    from acceptrun._util.outputs import claim_output, is_own_output
    from acceptrun.capture import data

    exclude = list(args.exclude)
    out = Path(args.output)
    src = Path(args.path)
    local = "://" not in args.path
    mark = f'"kind": "{data.KIND}"'  # an earlier manifest: replaced without --force
    inside = local and src.is_dir() and out.resolve().is_relative_to(src.resolve())
    # Its input is never its output, --force or not: the file it hashes, or a file of the
    # folder it hashes (its own earlier manifest in the folder is none: it is left out).
    if not local:
        inputs: list[Path] = []
    elif inside:
        inputs = [out] if out.is_file() and not is_own_output(out, mark) else []
    else:
        inputs = [src]
    # Before hashing, so a refusal costs nothing.
    claim_output(
        out, mark=mark, force=args.force, inputs=inputs, what="data manifest", parents=True
    )
    if inside:
        exclude.append(
            out.resolve().relative_to(src.resolve()).as_posix()
        )  # never hash the manifest itself
    manifest = data.snapshot(args.path, exclude=exclude)
    data.write_manifest(out, manifest)
    print(
        f"{out}: {manifest['count']} files, {manifest['total_bytes']:,} bytes, root {manifest['root_hash']}"
    )
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    from acceptrun.capture import data

    result = data.verify(args.path, data.load_manifest(args.manifest), ignore=[args.manifest])
    print(data.format_verify(result, manifest_path=args.manifest))
    return 0 if result.ok else 2


def register(sub: argparse._SubParsersAction[Any]) -> None:
    env = sub.add_parser("env", help="print this machine's provenance, or diff two runs'")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=cmd_env)
    env_sub = env.add_subparsers(dest="env_command", metavar="ACTION")
    ediff = env_sub.add_parser("diff", help="what changed between two runs' environments")
    add_run_argument(ediff, "run_a")
    add_run_argument(ediff, "run_b")
    ediff.set_defaults(func=cmd_env_diff)
    data = sub.add_parser("data", help="snapshot data into a manifest, or verify it")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    snap = data_sub.add_parser("snapshot", help="hash every file of PATH into a manifest")
    snap.add_argument("path", type=path_arg, help="directory, file or fsspec URL")
    snap.add_argument(
        "-o",
        "--output",
        required=True,
        type=file_arg,
        metavar="FILE",
        help="manifest file to write; an existing FILE is replaced only when it is an "
        "earlier manifest, or with --force (never a file of PATH)",
    )
    snap.add_argument(
        "--force", action="store_true", help="replace FILE even when it is not a manifest"
    )
    snap.add_argument(
        "--exclude",
        action="append",
        default=[],
        type=text(),
        metavar="GLOB",
        help="leave out matching files (repeatable)",
    )
    snap.set_defaults(func=cmd_data_snapshot)
    ver = data_sub.add_parser("verify", help="check PATH against a manifest")
    ver.add_argument("path", type=path_arg)
    ver.add_argument("manifest", type=file_arg)
    ver.set_defaults(func=cmd_data_verify)
