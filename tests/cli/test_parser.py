"""``modelyard``'s command line: an operator command is parsed without the user commands' module."""

from __future__ import annotations

import argparse
import subprocess
import sys

from modelyard.cli import OPERATOR_COMMANDS, build_parser


def commands(parser: argparse.ArgumentParser) -> set[str]:
    (subcommands,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return set(subcommands.choices)


def test_the_operator_commands_are_the_commands_parsed_without_the_user_ones():
    operator, every = commands(build_parser(user_commands=False)), commands(build_parser())

    assert operator == OPERATOR_COMMANDS
    assert {"login", "models", "push", "promote", "infer", "audit"} <= every - operator


def test_an_operator_command_runs_with_the_user_commands_unimportable():
    """createtoken, manage and the rest never load modelyard.client (its HTTP client, its 2,000-line module)."""
    code = (
        "import sys\n"
        "sys.modules['modelyard.client'] = None\n"
        "from modelyard.cli import parse_args\n"
        "args = parse_args(['createtoken', 'alice', '--role', 'admin', '--only-model', 'fraud-*'])\n"
        "print(args.command, args.username, args.role, args.only_model)\n"
        "print(parse_args(['worker', '--pool', 'solo']).celery_args)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["createtoken alice ['admin'] ['fraud-*']", "['--pool', 'solo']"]


def test_help_and_a_mistyped_command_still_name_every_command():
    help_text = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    mistyped = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "createtokn", "alice"], capture_output=True, text=True, timeout=60
    )

    assert help_text.returncode == 0, help_text.stderr
    assert "createtoken" in help_text.stdout and "promote" in help_text.stdout
    assert mistyped.returncode == 2
    assert "invalid choice: 'createtokn'" in mistyped.stderr
    assert "'createtoken'" in mistyped.stderr and "'promote'" in mistyped.stderr
