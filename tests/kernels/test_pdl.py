"""Programmatic dependent launch (kernels/pdl.py): off where there is none; on
the GPU, launches that may start early still read their inputs only once the
launch before them has written them."""

import pytest
import torch

from kernels.pdl import pdl_options
from kernels.rmsnorm import add_rmsnorm, rmsnorm, rmsnorm_reference
from kernels.router import gate_route, gate_route_reference


def test_pdl_is_off_on_the_cpu():
    assert pdl_options(torch.device("cpu")) == {"PDL": False}


@pytest.mark.gpu
@pytest.mark.parametrize("graphed", [False, True])
def test_gpu_dependent_launches_read_what_the_one_before_wrote(graphed):
    # A norm over many rows (several waves of programs), then two launches
    # that read its output: each may be resident before the one before it
    # ends, and only the wait at its start keeps it from reading rows not
    # yet written (the outputs' memory comes from the caching allocator,
    # holding whatever an earlier tensor left there).
    torch.manual_seed(0)
    t, h, e, k, eps = 16384, 4096, 8, 2, 1e-5
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(h, device="cuda", dtype=torch.bfloat16) + 0.5
    gate = torch.randn(e, h, device="cuda", dtype=torch.bfloat16) * 0.02

    def chain():
        y = rmsnorm(x, w, eps)
        s, y2 = add_rmsnorm(y, x, w, eps)
        ids, weights = gate_route(y2, gate, k)
        return y, s, y2, ids

    if graphed:
        chain()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, s, y2, ids = chain()
        for buf in (y, s, y2):
            buf.fill_(float("nan"))
        graph.replay()
    else:
        torch.empty(4 * t * h, dtype=torch.bfloat16, device="cuda").fill_(float("nan"))  # memory the chain reuses
        y, s, y2, ids = chain()
    torch.cuda.synchronize()
    # Each launch against the reference of what it read, the launch before's
    # final output: equal where the operations are the same.
    assert torch.allclose(y.float(), rmsnorm_reference(x, w, eps).float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(s, (y.float() + x.float()).to(torch.bfloat16))
    assert torch.allclose(y2.float(), rmsnorm_reference(s, w, eps).float(), rtol=2e-2, atol=2e-2)
    _, ids_ref, _ = gate_route_reference(y2, gate, k)
    same = (ids.sort(-1).values == ids_ref.sort(-1).values).all(-1).float().mean()
    assert float(same) > 0.98  # logits that tie in bf16 may be taken in either order
