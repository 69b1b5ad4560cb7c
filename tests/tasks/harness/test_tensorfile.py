"""Raw tensor files between worker and parent: the structure, dtype and values come back; a file
that does not match its header is refused."""

import pytest
import torch

from tasks.harness import tensorfile


@pytest.mark.parametrize(
    "output",
    [
        torch.randn(3, 5),
        (torch.randn(2).bfloat16(), torch.arange(4)),
        [torch.ones(2, 2, dtype=torch.float16), torch.tensor([True, False])],
        torch.empty(0, 7),
    ],
    ids=["tensor", "tuple", "list", "empty"],
)
def test_round_trip_keeps_structure_dtype_shape_and_values(output, tmp_path):
    tensorfile.write(output, tmp_path / "out.json")
    back = tensorfile.read(tmp_path / "out.json")

    assert type(back) is type(output)
    for original, read in zip(
        output if isinstance(output, (tuple, list)) else [output], back if isinstance(back, (tuple, list)) else [back]
    ):
        assert (read.dtype, read.shape) == (original.dtype, original.shape)
        assert torch.equal(read, original)


def test_a_data_file_that_does_not_match_its_header_is_refused(tmp_path):
    tensorfile.write(torch.randn(8), tmp_path / "out.json")
    (tmp_path / "out.json.0.bin").write_bytes(b"\0" * 4)

    with pytest.raises(ValueError, match="16 bytes|4 bytes"):
        tensorfile.read(tmp_path / "out.json")
