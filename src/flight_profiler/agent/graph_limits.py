"""How much of an autograd graph the agent may touch from Python without endangering the target.

Reading a node of an autograd graph from Python (``grad_fn``, ``next_functions``) changes how
that node is freed later: when the program drops a long chain whose nodes were read, freeing it
recurses once per read node, in whatever thread drops it. Measured with torch 2.13 on a chain
of 60,000 nodes: reading 45,000 of them then freeing the chain overflowed an 8 MB stack
(SIGSEGV); on a thread with a 1 MB stack reading 8,000 crashed and 4,000 did not. The cap
keeps a 2x margin below the 8 MB figure (20,000 read and freed: fine). So every graph
walk of the agent, over one request, stays within a budget derived from the smallest stack the
target's threads are likely to have, with a margin, and says when it stopped.
"""

from __future__ import annotations

import resource
import threading

# Measured: ~140 bytes of stack per read node at free time (1 MB: 4,000 fine, 8,000 crashed).
_BYTES_PER_NODE = 256
_DEFAULT_STACK = 8 << 20
MAX_NODES = 20_000  # 2x below the 45,000 that overflowed an 8 MB stack


def safe_graph_nodes() -> int:
    """Nodes one request may read: the smaller of MAX_NODES and what the thread stacks allow."""
    stacks = []
    configured = threading.stack_size()  # new threads' size, 0 = the platform default
    if configured:
        stacks.append(configured)
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_STACK)
    except (OSError, ValueError):
        soft = resource.RLIM_INFINITY
    stacks.append(_DEFAULT_STACK if soft == resource.RLIM_INFINITY or soft <= 0 else soft)
    return max(500, min(MAX_NODES, min(stacks) // _BYTES_PER_NODE))
