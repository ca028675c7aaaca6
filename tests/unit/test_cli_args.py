"""The command line's own errors: one line under the right command's usage, exit 2."""

from __future__ import annotations

import pytest

from tokenmill import cli


def test_an_unknown_flag_is_named_with_its_commands_usage(capsys) -> None:
    """`tokenmill serve --bogus` says so under serve's usage (argparse reports a subcommand's unknown flag
    with the top level's, which lists no serve flag at all), before anything loads."""
    for argv, prog in ((["serve", "--bogus-flag"], "tokenmill serve"),
                       (["bench", "serve", "--bogus-flag"], "tokenmill bench serve"),
                       (["--bogus-flag"], "tokenmill")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"{prog}: error: unrecognized arguments: --bogus-flag" in err, err
        assert err.startswith(f"usage: {prog} ")
