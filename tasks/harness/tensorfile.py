"""Outputs handed from a worker to the parent as raw bytes: a small JSON header and one .bin per tensor.

No pickle anywhere, so reading a file a candidate may have written runs none of its code, and no
zip or checksum either: torch.save spent about 110 ms per 64 MB output (H100 host), raw bytes on
tmpfs a memcpy. Only a tensor or a tuple/list of tensors can be written, which is all an output
may be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def write(output: Any, path: Path) -> None:
    """`output` (a tensor, or a tuple/list of tensors, on any device) as `path` + `path`.N.bin."""
    tensors = list(output) if isinstance(output, (tuple, list)) else [output]
    header = {"container": type(output).__name__ if isinstance(output, (tuple, list)) else None, "tensors": []}
    for index, tensor in enumerate(tensors):
        host = tensor.detach().contiguous().cpu()
        with open(f"{path}.{index}.bin", "wb") as data:
            if host.numel():
                host.reshape(-1).view(torch.uint8).numpy().tofile(data)
        header["tensors"].append({"dtype": str(host.dtype), "shape": list(host.shape)})
    Path(path).write_text(json.dumps(header))


def read(path: Path) -> Any:
    """What `write` wrote; ValueError if the header or a file does not add up."""
    header = json.loads(Path(path).read_text())
    tensors = []
    for index, meta in enumerate(header["tensors"]):
        dtype, shape = DTYPES[meta["dtype"]], [int(n) for n in meta["shape"]]
        numel = 1
        for n in shape:
            numel *= n
        data_path = Path(f"{path}.{index}.bin")
        expected_bytes = numel * torch.empty(0, dtype=dtype).element_size()
        if data_path.stat().st_size != expected_bytes:
            raise ValueError(f"{data_path.name}: {data_path.stat().st_size} bytes, the header says {expected_bytes}")
        flat = (
            torch.from_file(str(data_path), shared=False, size=numel, dtype=dtype)
            if numel
            else torch.empty(0, dtype=dtype)
        )
        tensors.append(flat.view(shape))
    container = header["container"]
    if container is None:
        if len(tensors) != 1:
            raise ValueError(f"{path}: a single output with {len(tensors)} tensors")
        return tensors[0]
    return tuple(tensors) if container == "tuple" else tensors
