"""carried_graphs.reaches / node_key: a node is the same node whatever Python wrapper stands
for it (the CUDA case below was seen on an H100 with torch 2.11's cuDNN LSTM)."""

from __future__ import annotations

from typing import Any

from flight_profiler.agent.carried_graphs import node_key, reaches


class CudnnRnnBackward0:
    def __init__(self, seq: int, children: list[Any] | None = None) -> None:
        self.seq = seq
        self.next_functions = [(c, 0) for c in children or []]

    def _sequence_nr(self) -> int:
        return self.seq


class AccumulateGrad(CudnnRnnBackward0):
    pass


def test_a_chain_is_found_when_the_previous_nodes_wrapper_was_replaced():
    # step k-1's node (seq 1) as the previous look saw it ...
    seen_then = CudnnRnnBackward0(1)
    wanted = {node_key(seen_then)}
    # ... now stands behind a new wrapper, and the old wrapper's address went to step k's node
    # (seq 3): modelled by reusing the very object with the new number
    new_wrapper_of_k_minus_1 = CudnnRnnBackward0(1, [AccumulateGrad(2**64 - 1)])
    seen_then.seq = 3
    seen_then.next_functions = [(new_wrapper_of_k_minus_1, 0)]
    assert reaches([seen_then], wanted, 100) == (True, 2)


def test_an_unrelated_graph_is_not_chained():
    previous = CudnnRnnBackward0(5)
    fresh = CudnnRnnBackward0(9, [CudnnRnnBackward0(7, [AccumulateGrad(2**64 - 1)])])
    assert reaches([fresh], {node_key(previous)}, 100)[0] is False


def test_leaf_nodes_without_a_real_number_keep_their_identity_by_id():
    a, b = AccumulateGrad(2**64 - 1), AccumulateGrad(2**64 - 1)
    assert node_key(a) != node_key(b)
    assert node_key(CudnnRnnBackward0(4)) == node_key(CudnnRnnBackward0(4))
