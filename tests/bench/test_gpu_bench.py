"""`stoker bench --device cuda`: a clear error without CUDA; the figures on a GPU machine."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_without_cuda_the_command_says_so(capsys):
    from stoker.cli import main

    assert main(["bench", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "without `--device`" in err


@pytest.fixture(scope="module")
def gpu_bench_ran_once(cuda_initialized: None) -> None:
    """The first run in a process opens CUDA's libraries (cuDNN, cuBLAS) and their files: done
    before the leak check's baseline, so the test's run shows what each run leaves behind."""
    if torch.cuda.is_available():
        from stoker.bench._gpu import run_gpu_bench

        run_gpu_bench("cuda", seconds=0.05)


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_bench_ran_once")
def test_gpu_bench_reports_rates_and_idle_fractions():
    from stoker.bench._gpu import render, run_gpu_bench

    result = run_gpu_bench("cuda", seconds=0.5)
    assert result.plain_copy_gbps > 0 and result.stoker_feed_gbps > 0
    assert 0 <= result.idle_stoker <= 1 and 0 <= result.idle_torch <= 1
    assert "GB/s" in render(result)
