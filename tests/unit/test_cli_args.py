"""Command-line parsing: options may come before, between or after a command's key=value overrides."""

from __future__ import annotations

import pytest

from aiayn.cli.main import build_parser, parse_args


@pytest.mark.parametrize("argv", [
    ["train", "r.toml", "--nproc", "2", "a.b=1", "c.d=2"],
    ["train", "--nproc", "2", "r.toml", "a.b=1", "c.d=2"],
    ["train", "r.toml", "a.b=1", "c.d=2", "--nproc", "2"],
    ["train", "r.toml", "a.b=1", "--nproc", "2", "c.d=2"],
])
def test_train_options_anywhere_among_the_overrides(argv: list[str]) -> None:
    args = parse_args(build_parser(), argv)
    assert (args.recipe, args.overrides, args.nproc) == ("r.toml", ["a.b=1", "c.d=2"], 2)


def test_an_unknown_option_is_still_an_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), ["train", "r.toml", "a.b=1", "--bogus", "c.d=2"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_stray_word_is_an_error_for_a_command_without_overrides(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["translate", "--checkpoint", "c", "stray"])
    assert "unrecognized arguments: stray" in capsys.readouterr().err
