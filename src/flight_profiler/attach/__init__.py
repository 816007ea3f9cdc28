"""CLI side of attaching: pre-flight, method choice, injection (gdb | remote_exec | pyrasite)."""
