"""A census must never make the target crash later when it frees a long autograd chain.

Reading autograd nodes from Python makes freeing them recurse once per read node (measured:
graph_limits.py). Each case runs in its own process: the failure mode is a SIGSEGV.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support import REPO, torch_available

pytestmark = pytest.mark.skipif(not torch_available(), reason="torch is not installed")

CHAIN = """
import sys, threading
sys.path.insert(0, {src!r})
import torch
from flight_profiler.agent import tensor_census

def fp_hold_and_drop():
    class Holder: pass
    holder = Holder()
    x = torch.zeros(4, requires_grad=True)
    for _ in range(60_000):          # a carried state never detached: one long chain
        x = x * 1.0001 + 1.0
    holder.state = x
    del x
    census = tensor_census.take(torch)
    print("census", census["totals"], flush=True)
    holder.state = None              # the program drops the chain, as it would next step
    print("freed", flush=True)

if {stack_mb}:
    threading.stack_size({stack_mb} << 20)
    t = threading.Thread(target=fp_hold_and_drop)
    t.start()
    t.join()
else:
    fp_hold_and_drop()
"""


@pytest.mark.parametrize("stack_mb", [0, 1])
def test_a_long_chain_read_by_a_census_is_freed_without_a_crash(stack_mb: int) -> None:
    code = textwrap.dedent(CHAIN.format(src=str(REPO / "src"), stack_mb=stack_mb))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    # before the cap (200,000 nodes) this died with SIGSEGV (-11) when the chain was freed
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "freed" in proc.stdout


def test_budget_follows_the_smallest_thread_stack() -> None:
    import threading

    from flight_profiler.agent import graph_limits

    old = threading.stack_size()
    try:
        threading.stack_size(1 << 20)
        assert graph_limits.safe_graph_nodes() == (1 << 20) // 256
    finally:
        threading.stack_size(old)
    assert graph_limits.safe_graph_nodes() <= graph_limits.MAX_NODES
