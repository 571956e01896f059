"""The package list of provenance: every installed distribution's name and version, fast."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from acceptrun.capture._probe import normalize_name, package_list


def parsed_whole(path: list[str] | None = None) -> dict[str, str]:
    """The list as importlib.metadata's e-mail parser reads each file whole."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(**({} if path is None else {"path": path})):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize_name(name), dist.version or "")
    return dict(sorted(found.items()))


def test_this_interpreter_s_packages_read_as_the_whole_file_parser_reads_them() -> None:
    listed = package_list()
    assert listed == parsed_whole()
    assert listed["pytest"] == metadata.version("pytest")


def dist_info(site: Path, folder: str, text: str, file: str = "METADATA") -> None:
    (site / folder).mkdir(parents=True)
    (site / folder / file).write_text(text)


def test_headers_end_at_the_first_empty_line(tmp_path: Path) -> None:
    description = "Name: not-this\nVersion: 9.9\n\nName: nor-this\n"
    dist_info(tmp_path, "Some_Pkg-1.2.dist-info",
              "Metadata-Version: 2.1\nname: Some_Pkg\nVERSION: 1.2\n"
              f"Summary: x\n  continued\n\n{description}")  # fmt: skip
    dist_info(tmp_path, "old.egg-info", "Metadata-Version: 1.0\nName: old\nVersion: 0.1\n",
              file="PKG-INFO")  # fmt: skip
    dist_info(tmp_path, "noversion-0.dist-info", "Metadata-Version: 2.1\nName: noversion\n")
    dist_info(tmp_path, "broken-0.dist-info", "Metadata-Version: 2.1\n")  # no name: left out
    listed = package_list(path=[str(tmp_path)])
    assert listed == {"old": "0.1", "noversion": "", "some-pkg": "1.2"}
    assert listed == parsed_whole(path=[str(tmp_path)])


def test_a_name_installed_twice_is_the_first_on_the_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    dist_info(first, "dup-2.0.dist-info", "Name: dup\nVersion: 2.0\n")
    dist_info(second, "dup-1.0.dist-info", "Name: dup\nVersion: 1.0\n")
    assert package_list(path=[str(first), str(second)]) == {"dup": "2.0"}
