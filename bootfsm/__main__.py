"""`python -m bootfsm` runs the CLI."""

from bootfsm.cli import entry

entry()
