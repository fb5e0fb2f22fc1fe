"""The doctor's distributed checks (SK501-SK503) and SK011's silence for distributed=True."""

from __future__ import annotations

import textwrap
from pathlib import Path

from stoker.doctor import diagnose_script
from stoker.doctor._distributed import check_local_rank_device

HEADER = (
    "import os\nimport torch\nimport torch.distributed as dist\n"
    "from torch.utils.data import DataLoader, DistributedSampler\nimport stoker\n"
)


def _codes(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "train.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return diagnose_script(path, usable_cores=8).codes


def test_sk011_fires_for_torch_and_is_silenced_by_distributed_true(tmp_path: Path) -> None:
    torch_loader = """
    def main(ds):
        dist.init_process_group("gloo")
        loader = DataLoader(ds, sampler=DistributedSampler(ds))
        for epoch in range(3):
            for batch in loader:
                pass
    """
    assert "SK011" in _codes(tmp_path, torch_loader)
    stoker_loader = torch_loader.replace(
        "DataLoader(ds, sampler=DistributedSampler(ds))",
        "stoker.DataLoader(ds, sampler=DistributedSampler(ds), distributed=True)",
    )
    assert "SK011" not in _codes(tmp_path, stoker_loader)


def test_sk501_unsharded_loader_in_a_ddp_script(tmp_path: Path) -> None:
    body = """
    def main(ds):
        dist.init_process_group("gloo")
        loader = DataLoader(ds, batch_size=8, shuffle=True)
    """
    assert "SK501" in _codes(tmp_path, body)
    fixed = body.replace("DataLoader(ds,", "stoker.DataLoader(ds, distributed=True,")
    assert "SK501" not in _codes(tmp_path, fixed)
    assert "SK501" not in _codes(tmp_path, body.replace('dist.init_process_group("gloo")', "pass"))


def test_sk502_cuda_device_without_local_rank(tmp_path: Path) -> None:
    body = """
    def main(model):
        dist.init_process_group("nccl")
        model.to("cuda")
    """
    assert "SK502" in _codes(tmp_path, body)
    fixed = body.replace('model.to("cuda")', 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))')
    assert "SK502" not in _codes(tmp_path, fixed)


def test_sk503_local_rank_device_mismatch() -> None:
    found = check_local_rank_device(
        local_rank=1, cuda_initialized=True, current_device=0, device_count=4
    )
    assert [f.code for f in found] == ["SK503"]
    assert "LOCAL_RANK=1 but the current CUDA device is 0" in found[0].observed
    ok = {"cuda_initialized": True, "current_device": 1, "device_count": 4}
    assert check_local_rank_device(local_rank=1, **ok) == []  # type: ignore[arg-type]
    assert check_local_rank_device(local_rank=None, **ok) == []  # type: ignore[arg-type]
    assert (
        check_local_rank_device(
            local_rank=1, cuda_initialized=False, current_device=0, device_count=4
        )
        == []
    )
