"""Member bytes from a dataset someone else made: each is parsed only as the format its
extension names, within a pixel limit, and pickles are opened only when asked for."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from untrusted_inputs import (
    EPS,
    deflated_torch_archive,
    image_bytes,
    npy_header_only,
    png_bomb,
    run_bounded,
    torch_save_bytes,
)

from stoker.errors import ConfigError
from stoker.shards import ShardDataset, ShardError, decode_field, make_decoder, pack
from stoker.shards._encode import IMAGE_EXTS
from stoker.shards._formats import IMAGE_FORMATS, PICKLE_EXTS, torch_load_is_safe
from stoker.shards._limits import MAX_IMAGE_PIXELS

# One real file per Pillow format an image extension may name.
SAMPLES = {fmt: image_bytes(fmt) for fmt in set(IMAGE_FORMATS.values())}
OTHER_FORMATS = {"GIF": image_bytes("GIF"), "ICO": image_bytes("ICO"), "TGA": image_bytes("TGA")}


class OneSample:
    """A pack source of one sample, key ``a``."""

    description = "one-sample"

    def __init__(self, members: list[tuple[str, bytes]]) -> None:
        self.members = members
        self.meta: dict[str, Any] = {}

    def __len__(self) -> int:
        return 1

    def sample(self, index: int) -> tuple[str, list[tuple[str, bytes]]]:
        return "a", self.members


def test_every_image_extension_names_exactly_one_pillow_format():
    assert set(IMAGE_FORMATS) == IMAGE_EXTS
    assert MAX_IMAGE_PIXELS == (1024 * 1024 * 1024 // 4 // 3)  # Pillow's own default


@pytest.mark.parametrize("ext", sorted(IMAGE_FORMATS))
def test_each_image_extension_decodes_its_own_format(ext: str):
    image = decode_field(ext, SAMPLES[IMAGE_FORMATS[ext]])
    assert image.format == IMAGE_FORMATS[ext] and image.size == (9, 7)
    array = decode_field(ext, memoryview(SAMPLES[IMAGE_FORMATS[ext]]), image="numpy")
    assert array.shape == (7, 9, 3) and array.dtype == np.uint8


@pytest.fixture
def eps_opened(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Records every time Pillow's EPS plugin (the road to Ghostscript) is asked to open."""
    from PIL import EpsImagePlugin

    calls: list[bytes] = []
    original = EpsImagePlugin.EpsImageFile._open

    def spy(self: Any) -> None:
        calls.append(b"opened")
        original(self)

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", spy)
    Image.init()
    return calls


@pytest.mark.parametrize("ext", sorted(IMAGE_FORMATS))
def test_postscript_under_an_image_extension_never_reaches_the_eps_parser(
    ext: str, eps_opened: list[bytes]
):
    with pytest.raises(ShardError, match=rf"is not a {IMAGE_FORMATS[ext]} image"):
        decode_field(ext, EPS)
    with pytest.raises(ShardError):
        make_decoder("numpy")({"__key__": "k", ext: EPS})  # type: ignore[misc]
    assert eps_opened == []
    Image.open(io.BytesIO(EPS))  # the spy works: Pillow's own sniffing picks EPS
    assert eps_opened == [b"opened"]


@pytest.mark.parametrize(
    ("ext", "holds"),
    [("png", "JPEG"), ("jpg", "PNG"), ("bmp", "TIFF"), ("tiff", "BMP"), ("webp", "PNG")]
    + [("jpg", fmt) for fmt in sorted(OTHER_FORMATS)],
)
def test_an_image_of_another_format_than_its_extension_is_refused(ext: str, holds: str):
    data = {**SAMPLES, **OTHER_FORMATS}[holds]
    with pytest.raises(ShardError, match=rf"field '{ext}' is not a {IMAGE_FORMATS[ext]} image"):
        decode_field(ext, data)


@pytest.mark.parametrize(("ext", "fmt"), [("gif", "GIF"), ("ico", "ICO"), ("tga", "TGA")])
def test_extensions_of_other_parsers_give_the_bytes_undecoded(ext: str, fmt: str):
    data = OTHER_FORMATS[fmt]
    for decode in ("pil", "numpy", "torch"):
        assert make_decoder(decode)({"__key__": "k", ext: memoryview(data)})[ext] == data  # type: ignore[misc,arg-type]


def test_a_png_bomb_is_refused_from_its_header_within_a_memory_budget(tmp_path: Path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_bomb(10_000))
    assert bomb.stat().st_size < 20_000
    for image in ("pil", "numpy"):
        result = run_bounded("case_decode", ext="png", path=str(bomb), image=image, mapping=False)
        assert result.get("raised") == "stoker.shards._errors.ShardError", result
        assert "10000x10000 PNG image (100,000,000 pixels)" in result["message"]
        assert "`max_image_pixels`" in result["message"]


@pytest.mark.parametrize("side", [10_000, 20_000])
def test_the_pixel_limit_is_a_stoker_error_not_a_pillow_warning_or_error(side: int):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DecompressionBombWarning would fail here
        with pytest.raises(ShardError, match="over the limit of 89,478,485") as caught:
            decode_field("png", png_bomb(side))
    assert not isinstance(caught.value.__cause__, Image.DecompressionBombError)


@pytest.mark.parametrize("decode", ["pil", "numpy", "torch", {"png": "numpy"}])
def test_the_pixel_limit_holds_for_a_sample_s_images_together(tmp_path: Path, decode: Any):
    """Sixty PNGs each under the limit decoded to 3.5 GB from a 595 KB sample: the limit is
    per sample, all its images together."""
    members = [(f"{i}.png", image_bytes("PNG", size=(40, 25))) for i in range(5)]  # 1,000 px each
    pack(OneSample(members), tmp_path / "shards", shard_size=1 << 20, workers=1)
    fits = ShardDataset(tmp_path / "shards", decode=decode, max_image_pixels=5000)[0]
    assert len([k for k in fits if not k.startswith("__")]) == 5
    over = ShardDataset(tmp_path / "shards", decode=decode, max_image_pixels=4999)
    with pytest.raises(ShardError, match=r"field '4.png' \(after 4,000 pixels of the sample's"):
        over[0]


def test_max_image_pixels_moves_the_limit_without_touching_pillow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # stoker neither reads nor sets it
    data = image_bytes("PNG", size=(100, 50))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert decode_field("png", data).size == (100, 50)
        assert decode_field("png", data, max_image_pixels=5000).size == (100, 50)
        with pytest.raises(ShardError, match=r"100x50 PNG image \(5,000 pixels\), over the lim"):
            decode_field("png", data, max_image_pixels=4999)
    assert Image.MAX_IMAGE_PIXELS == 10

    pack(OneSample([("png", data)]), tmp_path / "shards", shard_size=1 << 20, workers=1)
    assert ShardDataset(tmp_path / "shards", decode="numpy")[0]["png"].shape == (50, 100, 3)
    small = ShardDataset(tmp_path / "shards", decode="numpy", max_image_pixels=100)
    with pytest.raises(ShardError, match="sample 'a' field 'png' is a 100x50 PNG"):
        small[0]
    for bad in (0, -1, 1.5, True, "big"):
        with pytest.raises(ConfigError, match="`max_image_pixels` must be an int >= 1"):
            make_decoder("pil", max_image_pixels=bad)  # type: ignore[arg-type]


def test_an_npy_header_declaring_more_than_it_holds_is_refused_within_a_memory_budget(
    tmp_path: Path,
):
    member = tmp_path / "bomb.npy"
    member.write_bytes(npy_header_only((1 << 31,)))  # 16 GiB declared, 128 bytes held
    result = run_bounded("case_decode", ext="npy", path=str(member), image="pil", mapping=False)
    assert result.get("raised") == "stoker.shards._errors.ShardError", result
    assert "shape (2147483648,) (16.0 GiB) but only 0 bytes follow" in result["message"]
    buf = io.BytesIO()
    np.save(buf, np.arange(6).reshape(2, 3))
    assert decode_field("npy", buf.getvalue()).tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("ext", sorted(PICKLE_EXTS))
def test_pickled_members_stay_bytes_unless_a_mapping_names_them(ext: str):
    data = torch_save_bytes({"w": torch.ones(2)})
    sample = {"__key__": "k", ext: memoryview(data), "cls": b"3"}
    for decode in ("pil", "numpy", "torch"):
        assert make_decoder(decode)(sample)[ext] == data  # type: ignore[misc]
    assert make_decoder({"cls": int})(sample)[ext] == data  # type: ignore[misc]
    assert decode_field(ext, data) == data
    loaded = make_decoder({ext: "torch"})(sample)  # type: ignore[misc,dict-item]
    assert torch.equal(loaded[ext]["w"], torch.ones(2)) and loaded["cls"] == 3


class _Payload:
    """Unpickled by a full unpickler, this creates the file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_named_pickle_is_loaded_weights_only_so_its_code_never_runs(tmp_path: Path):
    marker = tmp_path / "ran"
    evil = torch_save_bytes({"w": _Payload(marker)})
    with pytest.raises(ShardError, match=r"sample 'k' field 'pth' .* cannot be decoded as a torch"):
        make_decoder({"pth": "torch"})({"__key__": "k", "pth": evil})  # type: ignore[misc,dict-item]
    assert not marker.exists()
    plain = pickle.dumps({"a": _Payload(marker)})
    with pytest.raises(ShardError, match=r"'pkl' is not a torch\.save archive"):
        make_decoder({"pkl": "torch"})({"__key__": "k", "pkl": plain})  # type: ignore[misc,dict-item]
    assert not marker.exists()
    pickle.loads(plain)  # the payload is real: a full unpickler runs it
    assert marker.exists()


def test_a_torch_archive_with_compressed_entries_is_refused_before_loading():
    data = deflated_torch_archive(64 << 20)
    assert len(data) < 1 << 20
    with pytest.raises(ShardError, match=r"declares 64.0 MiB .* compressed; torch.save stores"):
        make_decoder({"pth": "numpy"})({"__key__": "k", "pth": data})  # type: ignore[misc,dict-item]


def test_unpickling_is_refused_on_a_torch_older_than_the_fixed_version(
    monkeypatch: pytest.MonkeyPatch,
):
    assert torch_load_is_safe("2.10.0") and torch_load_is_safe("2.13.0+cpu")
    assert not torch_load_is_safe("2.9.1") and not torch_load_is_safe("2.10.0a0+git1234")
    monkeypatch.setattr(torch, "__version__", "2.9.1")
    with pytest.raises(ConfigError, match=r"needs torch >= 2.10.*CVE-2026-24747.*2\.9\.1"):
        make_decoder({"pth": "torch"})  # type: ignore[dict-item]
    assert make_decoder({"jpg": "numpy"}) is not None  # no pickle named: no refusal
    with pytest.raises(ConfigError, match=r"`decode\['pth'\]` must be a callable"):
        make_decoder({"pth": "weights"})  # type: ignore[dict-item]


# -- fuzz: every built-in decoder, on random and on mutated real bytes ---------------------

DECODER_EXTS = ["cls", "txt", "json", "npy", "pth", *sorted(IMAGE_FORMATS)]
SEEDS: dict[str, bytes] = {
    "cls": b"42",
    "txt": "h\u00e9".encode(),
    "json": b'{"a": [1, 2.5, null]}',
    "npy": (lambda b: (np.save(b, np.arange(12.0).reshape(3, 4)), b.getvalue())[1])(io.BytesIO()),
    "pth": torch_save_bytes({"w": torch.arange(4)}),
    **{ext: SAMPLES[fmt] for ext, fmt in IMAGE_FORMATS.items()},
}
FUZZ_DECODER = make_decoder({"pth": "numpy"}, max_image_pixels=1 << 20)  # type: ignore[dict-item]


@st.composite
def member_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    ext = draw(st.sampled_from(DECODER_EXTS))
    if draw(st.booleans()):
        return ext, draw(st.binary(max_size=256))
    data = bytearray(SEEDS[ext])
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    return ext, bytes(data[: draw(st.integers(0, len(data)))])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(member_bytes())
def test_fuzzed_members_give_a_value_or_a_shard_error(member: tuple[str, bytes]):
    ext, data = member
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns about corrupt EXIF and the like
        try:
            FUZZ_DECODER({"__key__": "k", ext: memoryview(data)})  # type: ignore[misc]
        except ShardError:
            pass
