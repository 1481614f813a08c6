"""Native image ops from Python, on JPEG shards written by the `webdataset` package with PIL
(installed by scripts/test.sh): decode + RandomResizedCrop + flip, the same for any number of
workers; truncated JPEGs reported by key (raise) or counted (skip); `chute bench --digest` with
`--transform` equal for 1 and 4 workers."""

import io
import json
import subprocess

import numpy as np
import pytest

import chute
from conftest import chute_bin

wds = pytest.importorskip("webdataset", reason="webdataset not installed (scripts/test.sh installs it)")
Image = pytest.importorskip("PIL.Image", reason="pillow not installed (scripts/test.sh installs it)")

OPS = {
    "jpg": {"as": "image", "ops": [
        {"op": "decode"},
        {"op": "random_resized_crop", "size": 48},
        {"op": "horizontal_flip"},
    ]},
    "cls": [{"op": "label"}],
}


def picture(i, h=96, w=128):
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 2 + i * 7) % 256, (y * 2 + i * 13) % 256, ((x + y) * i) % 256], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8))


def jpeg_bytes(img, quality=90):
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def write_shards(path, n=40, broken=()):
    pattern = str(path / "img-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=16) as sink:
        for i in range(n):
            data = jpeg_bytes(picture(i))
            if i in broken:
                data = data[: len(data) // 2]  # a truncated JPEG
            sink.write({"__key__": f"s{i:04d}", "jpg": data, "cls": str(i % 5).encode()})
    last = (n - 1) // 16
    return str(path / f"img-{{000000..{last:06d}}}.tar")


def test_decode_crop_flip_the_same_for_any_number_of_workers(tmp_path):
    urls = write_shards(tmp_path)
    runs = {}
    for workers in (0, 1, 4):
        loader = chute.Loader(chute.webdataset(urls), batch_size=8, shuffle=True, seed=3,
                              num_workers=workers, transforms=OPS)
        runs[workers] = [(b["image"].copy(), b["cls"].copy()) for b in loader]
    first = runs[0]
    assert len(first) == 5
    image, label = first[0]
    assert image.shape == (8, 48, 48, 3) and image.dtype == np.uint8
    assert label.dtype == np.int64 and label.shape == (8,)
    for workers in (1, 4):
        for (a, la), (b, lb) in zip(first, runs[workers]):
            assert np.array_equal(a, b) and np.array_equal(la, lb)
    # Another epoch: other crops.
    loader = chute.Loader(chute.webdataset(urls), batch_size=8, shuffle=False, transforms=OPS)
    e0 = np.concatenate([b["image"] for b in loader])
    loader.set_epoch(1)
    e1 = np.concatenate([b["image"] for b in loader])
    assert not np.array_equal(e0, e1)


def test_decode_and_resize_agree_with_pil(tmp_path):
    urls = write_shards(tmp_path, n=8)
    want = np.stack([
        np.asarray(Image.open(io.BytesIO(jpeg_bytes(picture(i)))).convert("RGB")
                   .resize((64, 48), Image.BILINEAR))
        for i in range(8)
    ]).astype(np.int32)

    def resized(reduced):
        ops = {"jpg": [{"op": "decode", "reduced": reduced}, {"op": "resize", "size": [48, 64]}]}
        loader = chute.Loader(chute.webdataset(urls), batch_size=8, transforms=ops)
        return np.concatenate([b["jpg"] for b in loader]).astype(np.int32)

    # Full-size decode, then antialiased bilinear resize: the resizers round differently (and
    # builds without libjpeg's SIMD decode full-size images with zune-jpeg).
    exact = np.abs(resized(False) - want)
    assert exact.mean() < 2.0, exact.mean()
    # DCT-scaled decode (1/2 here) instead of a resize filter: the same picture, with
    # different filtering at sharp edges (these pictures are sawtooth patterns).
    scaled = np.abs(resized(True) - want)
    assert scaled.mean() < 4.0, scaled.mean()


def test_images_of_differing_sizes_come_as_a_list_or_padded_with_a_mask(tmp_path):
    sizes = [(40, 56), (64, 48), (40, 56), (33, 70), (50, 50)]
    pattern = str(tmp_path / "var-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=100) as sink:
        for i, (h, w) in enumerate(sizes):
            sink.write({"__key__": f"v{i}", "jpg": jpeg_bytes(picture(i, h, w))})
    src = str(tmp_path / "var-000000.tar")
    ops = {"jpg": [{"op": "decode"}]}
    pil = [np.asarray(Image.open(io.BytesIO(jpeg_bytes(picture(i, h, w)))).convert("RGB"))
           for i, (h, w) in enumerate(sizes)]

    batches = list(chute.Loader(chute.webdataset(src), batch_size=4, transforms=ops))
    images = [img for b in batches for img in b["jpg"]]
    assert [img.shape for img in images] == [(h, w, 3) for h, w in sizes]
    for got, want in zip(images, pil):
        # libjpeg-turbo's decoder, as PIL's: the same pixels (zune-jpeg, in builds without it,
        # rounds chroma upsampling differently).
        assert np.abs(got.astype(np.int32) - want).mean() < 1.0

    loader = chute.Loader(chute.webdataset(src), batch_size=4, transforms=ops, pad=True)
    assert loader.pad is True
    first = next(iter(loader))
    assert first["jpg"].shape == (4, 64, 70, 3) and first["jpg_mask"].dtype == np.bool_
    for k, (h, w) in enumerate(sizes[:4]):
        assert np.array_equal(first["jpg"][k, :h, :w], images[k])
        assert first["jpg_mask"][k, :h, :w].all() and first["jpg_mask"][k].sum() == h * w * 3
        assert not first["jpg"][k][~first["jpg_mask"][k]].any()


def test_truncated_jpeg_raises_with_its_key_or_is_skipped(tmp_path):
    urls = write_shards(tmp_path, n=24, broken={5})
    loader = chute.Loader(chute.webdataset(urls), batch_size=8, transforms=OPS)
    it = iter(loader)
    with pytest.raises(chute.CorruptDataError, match="s0005") as e:
        next(it)
    assert "JPEG" in str(e.value)
    loader = chute.Loader(chute.webdataset(urls), batch_size=8, transforms=OPS, on_error="skip",
                          num_workers=2)
    batches = list(loader)
    assert [len(b["cls"]) for b in batches] == [8, 8, 8], "the batch stays full"
    assert loader.stats()["skipped"] == 1


def test_bad_op_specs_are_config_errors(tmp_path):
    urls = write_shards(tmp_path, n=4)
    with pytest.raises(chute.ConfigError, match="resize needs a decoded image"):
        chute.Loader(chute.webdataset(urls), batch_size=2,
                     transforms={"jpg": [{"op": "resize", "size": 8}]})
    with pytest.raises(TypeError, match="callables .* or op specs"):
        chute.Loader(chute.webdataset(urls), batch_size=2, transforms=[42])


def test_native_ops_then_a_python_transform(tmp_path):
    urls = write_shards(tmp_path, n=8)

    def brighten(sample):
        sample["image"] = np.minimum(sample["image"].astype(np.int16) + 10, 255).astype(np.uint8)
        return sample

    plain = list(chute.Loader(chute.webdataset(urls), batch_size=8, transforms=[OPS]))
    brighter = list(chute.Loader(chute.webdataset(urls), batch_size=8, transforms=[OPS, brighten]))
    a, b = plain[0]["image"].astype(np.int16), brighter[0]["image"].astype(np.int16)
    assert np.array_equal(np.minimum(a + 10, 255), b)


def test_cli_bench_digest_with_crops_is_the_same_for_1_and_4_workers(tmp_path):
    binary = chute_bin()
    urls = write_shards(tmp_path, n=40, broken={7})
    digests = []
    for workers in ("1", "4"):
        out = subprocess.run(
            [binary, "bench", urls, "--batch-size", "8", "--workers", workers, "--json",
             "--digest", "--quiet", "--on-error", "skip", "--transform", json.dumps(OPS)],
            capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)
        assert s["samples"] == 40
        digests.append(s["digest"])
    assert digests[0] == digests[1]
    out = subprocess.run([binary, "bench", urls, "--batch-size", "8", "--quiet",
                          "--transform", json.dumps(OPS)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "s0007" in out.stderr and "JPEG" in out.stderr, out.stderr
