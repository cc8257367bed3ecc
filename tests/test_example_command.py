"""``auditor example OUT [--kind ...]``: the study generator as a command, driven through
``main([...])``: the default kind is the bundled example study byte for byte, the other
kinds are the generator's presets, and a bad OUT or option is one line and exit 2."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

import auditor._studygen
from auditor import _studygen as gen
from auditor._cli import main
from auditor._cli.example import KINDS
from tests.helpers import EXAMPLE


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def one_error_line(captured: pytest.CaptureFixture[str]) -> str:
    err = captured.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("auditor: error: example: "), err
    return err


def test_default_kind_writes_the_bundled_example_study_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "study"
    assert main(["example", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    written = tree_bytes(out)
    assert len(written) > 100
    assert written == tree_bytes(EXAMPLE)  # the repository's fixtures/example_study
    bundled = importlib.resources.files("auditor") / "_example_study"  # the package data
    with importlib.resources.as_file(bundled) as path:
        assert written == tree_bytes(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]  # no staging left


def test_an_empty_out_directory_is_filled(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["example", str(out), "--kind", "example"]) == 0
    assert tree_bytes(out) == tree_bytes(EXAMPLE)


@pytest.mark.parametrize(("kind", "options"), [
    ("mixed", {}),
    ("scale", {"elements": 3, "trace_samples": 25, "log_lines": 7}),
])
def test_other_kinds_are_the_generators_presets(
    kind: str, options: dict[str, int], tmp_path: Path
) -> None:
    argv = ["example", str(tmp_path / "cli"), "--kind", kind]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    assert main(argv) == 0
    expected = gen.generate(kind, tmp_path / "api", **options)
    assert tree_bytes(tmp_path / "cli") == tree_bytes(expected)
    assert tree_bytes(expected) != tree_bytes(EXAMPLE)


def test_the_command_offers_every_preset() -> None:
    assert KINDS == gen.PRESETS


def test_a_non_empty_out_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["example", str(out)]) == 2
    assert "refusing to write into non-empty" in one_error_line(capsys)
    assert tree_bytes(out) == {"keep.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_out_that_is_a_file_or_a_link_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["example", str(tmp_path / "file")]) == 2
    assert "over the file" in one_error_line(capsys)
    assert (tmp_path / "file").read_text() == "x"
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    assert main(["example", str(tmp_path / "link")]) == 2
    assert "link" in one_error_line(capsys)
    assert list((tmp_path / "dir").iterdir()) == []


def test_an_out_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["example", str(tmp_path / "file" / "study")]) == 2
    assert "cannot write" in one_error_line(capsys)


@pytest.mark.parametrize("argv", [
    ["--kind", "nope"], ["--elements", "0", "--kind", "scale"], ["--log-lines", "-1"],
    ["--trace-samples", "many"],
])
def test_bad_options_are_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["example", str(tmp_path / "out"), *argv]) == 2
    one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_no_out_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["example"]) == 2
    one_error_line(capsys)


def test_an_interrupted_generation_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = auditor._studygen.generate

    def interrupted(kind: str, root: Path, **options: int) -> Path:
        real(kind, root, **options)  # the whole study is written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(auditor._studygen, "generate", interrupted)
    assert main(["example", str(tmp_path / "out")]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_no_command_names_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "example" in capsys.readouterr().err
