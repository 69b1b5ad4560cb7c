"""CUDA IPC handover (tasks/harness/ipc.py): what a worker exports, the parent takes exactly, and a
header that does not match the memory behind its handle is refused without touching that memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]

ROOT = Path(__file__).resolve().parents[3]
EXPORTER = """
import json, time, torch
from tasks.harness import ipc
torch.manual_seed(0)
values = (
    torch.randn(1000, 33, device="cuda"),
    torch.arange(7, device="cuda", dtype=torch.int64),
    torch.randn(5, device="cuda").to(torch.bfloat16),
    torch.empty(0, device="cuda"),
)
transposed = torch.randn(64, 32, device="cuda").t()  # not contiguous
headers = {"tuple": ipc.export(values), "single": ipc.export(transposed)}
plain = {"tuple": [v.float().cpu().tolist() for v in values], "single": transposed.cpu().tolist()}
print(json.dumps({"headers": headers, "values": plain}), flush=True)
time.sleep(300)
"""


@pytest.fixture
def exporter():
    """A separate process that exported its outputs and holds them, with what it exported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", EXPORTER], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = process.stdout.readline()
        assert line, "the exporter died"
        yield process, json.loads(line)
    finally:
        process.kill()
        process.wait()


def test_the_parent_takes_what_the_worker_exported(exporter):
    from tasks.harness import ipc

    _, exported = exporter
    device = torch.device("cuda", 0)
    taken = ipc.take(exported["headers"]["tuple"], device)
    assert isinstance(taken, tuple) and len(taken) == 4
    assert [t.dtype for t in taken] == [torch.float32, torch.int64, torch.bfloat16, torch.float32]
    assert [tuple(t.shape) for t in taken] == [(1000, 33), (7,), (5,), (0,)]
    for tensor, values in zip(taken, exported["values"]["tuple"]):
        assert tensor.is_cuda
        assert torch.equal(tensor.float().cpu(), torch.tensor(values).reshape(tensor.shape))
    single = ipc.take(exported["headers"]["single"], device)
    assert single.shape == (32, 64) and single.is_contiguous()
    assert torch.equal(single.cpu(), torch.tensor(exported["values"]["single"]))


def test_a_header_that_claims_more_than_its_allocation_is_refused(exporter):
    from tasks.harness import ipc

    _, exported = exporter
    header = exported["headers"]["single"]
    header["tensors"][0]["shape"] = [32, 64 * 1024]  # the allocation holds 32x64 floats
    with pytest.raises(ValueError, match="allocation holds"):
        ipc.take(header, torch.device("cuda", 0))
    # the refusal read nothing past the allocation: this process's CUDA context still works
    assert float(torch.ones(4, device="cuda").sum()) == 4.0


@pytest.mark.parametrize(
    "broken",
    [
        {"container": None, "tensors": [{"dtype": "torch.float32", "shape": [4], "handle": "00" * 64}]},
        {"container": None, "tensors": [{"dtype": "torch.float32", "shape": [4], "handle": None}]},
        {"container": None, "tensors": [{"dtype": "float32!", "shape": [4], "handle": "00" * 64}]},
        {"container": None, "tensors": [{"dtype": "torch.float32", "shape": [-4], "handle": "00" * 64}]},
        {"tensors": "no list"},
        ["not a header"],
    ],
    ids=["zero handle", "no handle", "unknown dtype", "negative size", "tensors not a list", "not a dict"],
)
def test_malformed_headers_are_a_clear_error(broken):
    from tasks.harness import ipc

    with pytest.raises(ValueError):
        ipc.take(broken, torch.device("cuda", 0))


def test_memory_of_a_worker_that_has_gone_does_not_open(exporter):
    from tasks.harness import ipc

    process, exported = exporter
    process.kill()
    process.wait()
    with pytest.raises(ValueError, match="does not open"):
        ipc.take(exported["headers"]["single"], torch.device("cuda", 0))
