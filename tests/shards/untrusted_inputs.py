"""Crafted dataset contents (real PNG, JPEG, HDF5, LMDB bytes), and a child process that runs
one case under a memory budget and a time limit.

A module of its own, not ``conftest``: the child interpreter imports it by name.
"""

from __future__ import annotations

import io
import json
import os
import resource
import struct
import subprocess
import sys
import traceback
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
RESULT_TAG = "BOUNDED-RESULT "
# Address space a bounded case may add to what the child holds after its imports: far below
# what each crafted input would make an unguarded reader allocate (>= 512 MiB).
BUDGET_MIB = 192
# Wall-clock limit of a bounded case, imports included.
LIMIT_S = 120.0

#: PostScript in a file whose extension names an image format: Pillow's EPS plugin would hand
#: it to Ghostscript.
EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    b"(/etc/passwd) (r) file pop\nshowpage\n%%EOF\n"
)


def image_bytes(fmt: str, size: tuple[int, int] = (9, 7), mode: str = "RGB") -> bytes:
    """A real image of ``size`` encoded by Pillow as ``fmt``."""
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(side: int) -> bytes:
    """A valid 1-bit ``side`` x ``side`` PNG of zeros: about 12 KB for 10,000 x 10,000."""
    row = b"\0" * (1 + (side + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join([compressor.compress(row) for _ in range(side)] + [compressor.flush()])
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def npy_header_only(shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """An ``.npy`` header declaring ``shape`` with no data after it."""
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def torch_save_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deflated_torch_archive(extra_bytes: int) -> bytes:
    """A torch.save archive with one more entry, ``extra_bytes`` of zeros deflated: a small
    file whose entry declares far more than it holds."""
    source = zipfile.ZipFile(io.BytesIO(torch_save_bytes({"w": 1})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as target:
        for entry in source.infolist():
            target.writestr(entry.filename, source.read(entry))
        prefix = source.infolist()[0].filename.split("/")[0]
        target.writestr(
            f"{prefix}/data/99", b"\0" * extra_bytes, compress_type=zipfile.ZIP_DEFLATED
        )
    return out.getvalue()


# -- HDF5 files that reach outside themselves, or declare more than they hold -------------


SECRET = b"SECRET-of-the-user:" + b"s3cr3t" * 6


def write_secret(folder: Path) -> Path:
    """A file outside the dataset folder that no sample may ever contain."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "secret.bin"
    path.write_bytes(SECRET)
    return path


def hdf5_reaching_out(path: Path, secret: Path, how: str) -> Path:
    """An HDF5 file whose dataset ``x`` (and ``label``) reads ``secret`` by ``how``:
    ``"external"`` storage, a ``"virtual"`` dataset, an ``"link"`` (external link), or a
    ``"soft-to-link"`` (a soft link to an external link)."""
    import h5py

    n = len(SECRET)
    path.parent.mkdir(parents=True, exist_ok=True)
    source = secret.with_suffix(".h5")
    if how != "external":
        with h5py.File(source, "w") as f:
            f["s"] = np.frombuffer(SECRET, dtype=np.uint8)[None]
    with h5py.File(path, "w") as f:
        f["label"] = np.array([3])
        if how == "external":
            f.create_dataset("x", shape=(1, n), dtype="u1", external=[(str(secret), 0, n)])
        elif how == "virtual":
            layout = h5py.VirtualLayout(shape=(1, n), dtype="u1")
            layout[:] = h5py.VirtualSource(str(source), "s", shape=(1, n))
            f.create_virtual_dataset("x", layout)
        elif how == "link":
            f["x"] = h5py.ExternalLink(str(source), "/s")
        elif how == "soft-to-link":
            f["far"] = h5py.ExternalLink(str(source), "/s")
            f["x"] = h5py.SoftLink("/far")
        else:
            raise ValueError(how)
    return path


def hdf5_row_bomb(path: Path) -> Path:
    """A file of about 1.4 KB whose one row declares 1 GiB (its chunks are never written)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(1, 1 << 30), dtype="u1", chunks=(1, 1 << 20))
    return path


def hdf5_chunk_bomb(path: Path, rows: int = 512, width: int = 1 << 20) -> Path:
    """A file of about 0.5 MB whose rows are 1 MiB, stored in one gzip chunk of 512 MiB of
    zeros: reading any row decompresses the whole chunk."""
    import h5py

    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "x", shape=(rows, width), dtype="u1", chunks=(rows, width), compression="gzip"
        )
        compressor = zlib.compressobj(6)
        zeros = b"\0" * width
        blob = b"".join([compressor.compress(zeros) for _ in range(rows)] + [compressor.flush()])
        ds.id.write_direct_chunk((0, 0), blob)
    return path


def write_lmdb(path: Path, records: dict[bytes, bytes]) -> Path:
    import lmdb

    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in records.items():
            txn.put(key, value)
    env.close()
    return path


# -- bounded cases: run in a fresh interpreter under RLIMIT_AS and a time limit -----------


def case_decode(ext: str, path: str, image: str, mapping: bool) -> str:
    from stoker.shards import decode_field, make_decoder

    data = Path(path).read_bytes()
    if mapping:
        decoder = make_decoder({ext: image})  # type: ignore[dict-item]
        assert decoder is not None
        value = decoder({"__key__": "k", ext: data})[ext]
    else:
        value = decode_field(ext, data, image=image)  # type: ignore[arg-type]
    return f"decoded a {type(value).__name__}"


def case_hdf5_row(path: str) -> str:
    from stoker.shards import HDF5Dataset

    row = HDF5Dataset(path)[0]
    return f"read a row of {sum(np.asarray(v).nbytes for v in row.values())} bytes"


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _child(case: str, raw_kwargs: str) -> None:
    import stoker.shards  # noqa: F401 (imports count outside the budget)

    func = globals()[case]
    budget = BUDGET_MIB << 20
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + budget, resource.RLIM_INFINITY))
    try:
        result = {"returned": func(**json.loads(raw_kwargs))}
    except BaseException as exc:
        result = {
            "raised": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(RESULT_TAG + json.dumps(result), flush=True)


def run_bounded(case: str, **kwargs: Any) -> dict[str, Any]:
    """Run module-level ``case(**kwargs)`` in a fresh interpreter whose address space may
    grow by at most :data:`BUDGET_MIB` after its imports, killed after :data:`LIMIT_S`.

    Returns:
        ``{"returned": str}`` or ``{"raised": "module.Type", "message": str, ...}``, with
        ``peak_rss_mib``.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    code = f"import untrusted_inputs as m; m._child({case!r}, {json.dumps(kwargs)!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=LIMIT_S,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return dict(json.loads(line[len(RESULT_TAG) :]))
    raise AssertionError(
        f"{case} ended with code {proc.returncode} and no result; stderr:\n{proc.stderr[-4000:]}"
    )
