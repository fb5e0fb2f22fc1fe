"""What an HDF5 file may make stoker read: links and storage outside the file, row sizes.

HDF5 can keep a dataset's bytes in other files: external storage (raw bytes in whatever file
the creator named), virtual datasets (mapped from datasets of other files) and external links
(a name in this file that opens another file). In a file someone else made they could read the
user's own files into samples, so they are refused unless the caller passes
``allow_external=True``. Row sizes come from metadata and are checked before a row is read: a
file of a few KB can declare rows, or compressed chunks, of gigabytes.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from typing import Any, NoReturn

from stoker.shards._errors import ShardError
from stoker.shards._limits import check_sample_bytes

__all__ = [
    "MAX_SOFT_LINK_HOPS",
    "check_path_links",
    "check_row_bytes",
    "check_storage",
    "check_tree_links",
    "is_variable_length",
]

#: Soft links followed in one path before it is refused as a loop (HDF5's own default limit
#: on link traversals, ``H5L_NUM_LINKS``).
MAX_SOFT_LINK_HOPS = 16


def _refuse(file: Any, what: str) -> NoReturn:
    raise ShardError(
        f"{file.filename}: {what}. Stoker reads only what is inside the file: if you trust it, "
        "pass `allow_external=True` to HDF5Dataset (`stoker pack` has no such option: pack a "
        "`module:factory` whose samples you build from that dataset)."
    )


def check_tree_links(file: Any) -> None:
    """Refuse a file holding a link into another file anywhere in its tree of groups.

    Raises:
        ShardError: naming the link and its target.
    """
    import h5py

    found: list[str] = []

    def visit(name: bytes, info: Any) -> int | None:
        if info.type not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
            found.append(name.decode("utf-8", "surrogateescape"))
            return 1  # stop at the first one
        return None

    file.id.links.visit(visit, info=True)
    if found:
        _refuse(file, f"{_describe_link(file, found[0])} points outside the file")


def _describe_link(file: Any, name: str) -> str:
    import h5py

    link = file.get(name, getlink=True)
    if isinstance(link, h5py.ExternalLink):
        return f"link {name!r} (to {link.path!r} in {link.filename!r})"
    return f"link {name!r} (a {type(link).__name__})"


def check_path_links(file: Any, name: str, hops: int = 0) -> None:
    """Refuse a dataset path that crosses a link into another file.

    Soft links are followed within the file (at most :data:`MAX_SOFT_LINK_HOPS`); nothing is
    opened through an external link. A path that does not exist passes: the caller reports it.

    Raises:
        ShardError: naming the link and its target.
    """
    import h5py

    parts = [p for p in name.split("/") if p]
    current = "/"
    for i, part in enumerate(parts):
        group = file[current]
        if not isinstance(group, h5py.Group):
            return
        link = group.get(part, getlink=True)
        here = posixpath.join(current, part)
        if link is None or isinstance(link, h5py.HardLink):
            current = here
            continue
        if not isinstance(link, h5py.SoftLink):
            _refuse(file, f"{_describe_link(file, here)}, on the path of {name!r}, leaves the file")
        if hops >= MAX_SOFT_LINK_HOPS:
            raise ShardError(
                f"{file.filename}: resolving {name!r} follows more than {MAX_SOFT_LINK_HOPS} soft "
                "links (a loop?); name the dataset by its own path in `fields`."
            )
        target = posixpath.join(current, link.path)  # an absolute link.path replaces current
        check_path_links(file, posixpath.join(target, *parts[i + 1 :]), hops + 1)
        return


def check_storage(file: Any, name: str, dataset: Any) -> None:
    """Refuse a dataset whose bytes live in other files (virtual or external storage).

    Raises:
        ShardError: naming the dataset and the files.
    """
    if dataset.is_virtual:
        sources = sorted({s.file_name for s in dataset.virtual_sources()})
        _refuse(file, f"dataset {name!r} is virtual, mapped from {sources}")
    plist = dataset.id.get_create_plist()
    count = plist.get_external_count()
    if count:
        files = sorted(
            {plist.get_external(i)[0].decode("utf-8", "surrogateescape") for i in range(count)}
        )
        _refuse(file, f"dataset {name!r} keeps its bytes in external files {files}")


def is_variable_length(dataset: Any) -> bool:
    """Whether the rows of ``dataset`` have sizes that only reading tells (vlen bytes, str)."""
    return bool(dataset.dtype.kind == "O")


def check_row_bytes(file: Any, datasets: Mapping[str, Any], limit: int | None) -> int:
    """Check what one row of ``datasets`` costs to read, from metadata alone.

    A row of fixed-size values takes its shape times the item size; a row of a compressed,
    chunked dataset needs its whole chunk decompressed first. Variable-length values count
    only their descriptors here (their bytes are checked when read).

    Returns:
        The bytes of one row of the fixed-size datasets.

    Raises:
        ShardError: if a row or a compressed chunk takes more than ``limit`` bytes.
    """
    sizes: dict[str, int] = {}
    for name, ds in datasets.items():
        itemsize = ds.dtype.itemsize
        sizes[name] = math.prod(ds.shape[1:]) * itemsize
        if ds.chunks is not None and ds.id.get_create_plist().get_nfilters() > 0:
            check_sample_bytes(
                f"{file.filename}: reading a row of dataset {name!r} decompresses a whole chunk "
                f"of shape {ds.chunks} ({ds.dtype}), which",
                math.prod(ds.chunks) * itemsize,
                limit,
            )
    total = sum(sizes.values())
    if limit is not None and total > limit:
        big = sorted(sizes, key=sizes.__getitem__, reverse=True)[:3]
        shown = ", ".join(f"{n!r} {datasets[n].shape[1:]} {datasets[n].dtype}" for n in big)
        check_sample_bytes(f"{file.filename}: one row of {shown}", total, limit)
    return total
