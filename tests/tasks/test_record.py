"""tasks/record.py: which host and which GPU each attempt names."""

import shutil
import subprocess

import pytest
import torch

from tasks import gpus, record


def test_the_host_is_kforge_host_where_set_else_the_hostname(monkeypatch):
    import socket

    monkeypatch.delenv("KFORGE_HOST", raising=False)
    assert record.host_name() == socket.gethostname()
    monkeypatch.setenv("KFORGE_HOST", "gpu-a")
    assert record.host_name() == "gpu-a"


def test_a_cpu_attempt_names_no_gpu():
    assert gpus.gpu_of("cpu") == {"gpu_index": None, "gpu_name": None, "gpu_uuid": None}
    assert gpus.gpu_of("cuda", 3)["gpu_index"] == 3  # the index it was given, even where no GPU is seen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi to compare with")
def test_a_gpu_attempt_names_the_gpu_as_nvidia_smi_does():
    gpu = gpus.gpu_of("cuda")
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert gpu["gpu_index"] == 0
    assert f"{gpu['gpu_name']}, {gpu['gpu_uuid']}" in listed, (gpu, listed)
