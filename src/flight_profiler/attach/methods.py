"""The injection methods a user may pick (``--method``): a leaf, so that the CLI's option
table does not load the injectors themselves (about 20 ms of a later command's start-up)."""

from __future__ import annotations

METHODS = ("auto", "ptrace", "remote_exec", "gdb", "pyrasite")
