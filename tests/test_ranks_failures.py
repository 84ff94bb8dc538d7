"""A collective that fails says why: a time-out says it timed out (after how long, on which rank,
in which collective), the death of another rank says so, and any other failure (a mismatched
collective, an NCCL error) names its exception, chained to the ComputationError."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch.distributed as dist

from dfmp2.run.ranks import Team
from dfmp2.util.errors import ComputationError

from conftest import ROOT

# what torch 2.x's gloo raises (the source prefix included) for a time-out and a lost peer
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                "waiting 60000ms for recv operation to complete")
GLOO_PEER_LOST = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:52886. This is typically caused by a remote worker crashing.")


def failing_all_reduce(monkeypatch, error):
    """Rank 0 of a team of two whose all_reduce raises `error`: the ComputationError it gives."""
    def all_reduce(*args, **kwargs):
        raise error

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    with pytest.raises(ComputationError) as raised:
        Team(0, 2, "gloo", 60).all_reduce_sum(np.zeros(3))
    return raised.value


def test_a_failure_that_is_no_dead_rank_names_its_cause(monkeypatch):
    cause = RuntimeError("Tensors must be CUDA and dense; got dtype torch.complex64\nsecond line")
    error = failing_all_reduce(monkeypatch, cause)
    assert str(error) == "rank 0/2: all_reduce failed: RuntimeError: Tensors must be CUDA and dense; got dtype " \
                         "torch.complex64"
    assert "another rank" not in str(error) and "timed out" not in str(error)
    assert error.__cause__ is cause


def test_a_time_out_says_it_timed_out_and_after_how_long(monkeypatch):
    cause = RuntimeError(GLOO_TIMEOUT)
    error = failing_all_reduce(monkeypatch, cause)
    assert str(error).startswith("rank 0/2: all_reduce timed out after 60 s (")
    assert "RuntimeError: Timed out waiting 60000ms for recv operation to complete" in str(error)
    assert "unbound_buffer.cc" not in str(error)  # gloo's source location is not the user's business
    assert error.__cause__ is cause
    assert "timed out after 60 s" in str(failing_all_reduce(monkeypatch, TimeoutError("no answer")))


def test_a_dead_rank_is_told_apart(monkeypatch):
    cause = RuntimeError(GLOO_PEER_LOST)
    error = failing_all_reduce(monkeypatch, cause)
    assert str(error).startswith("rank 0/2: all_reduce failed: another rank stopped (its connection closed: "
                                 "RuntimeError: Connection closed by peer")
    assert "timed out" not in str(error) and error.__cause__ is cause


# two ranks over gloo with a 3 s time-out: rank 1 is late to the all-reduce, so rank 0 times out (and
# exits); rank 1 then finds rank 0 gone. Each prints its error's message
TWO_RANKS = textwrap.dedent("""
    import os, time
    import numpy as np
    from dfmp2.run.ranks import Team
    from dfmp2.util.errors import ComputationError
    team = Team.join("cpu", False, timeout_s=3)
    if team.rank == 1:
        time.sleep(7)
    try:
        team.all_reduce_sum(np.ones(2))
    except ComputationError as error:
        print(error, flush=True)
        os._exit(1)  # at once: gloo's threads may abort an interpreter that exits with its group still open
""")


def test_a_real_time_out_and_the_lost_rank_it_leaves():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                   LOCAL_RANK=str(rank), PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, "-c", TWO_RANKS], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [1, 1], outputs
    assert outputs[0].startswith("rank 0/2: all_reduce timed out after 3 s ("), outputs
    assert outputs[1].startswith("rank 1/2: all_reduce failed: another rank stopped"), outputs
