"""Zero copy: numpy and DLPack see chute's own buffers, which go back to its pool; no leak."""

import ctypes
import gc
import itertools

import numpy as np
import pytest

import chute
from conftest import WINDOW


def first_tensor(source, **kw) -> chute.Tensor:
    return next(iter(chute.Loader(source, batch_size=4, output="dlpack", **kw)))["tokens"]


def test_numpy_views_chute_memory(source100):
    t = first_tensor(source100)
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr
    assert a.base is t, "the array keeps the chute.Tensor (and so its buffer) alive"
    assert a.flags.c_contiguous and a.flags.writeable
    a[0, 0] = 999
    assert np.asarray(t)[0, 0] == 999, "one memory, two views"
    raw = (ctypes.c_int64 * 1).from_address(t.data_ptr)
    assert raw[0] == 999, "the pointer is the data"

    batch = next(iter(chute.Loader(source100, batch_size=4)))  # output="numpy"
    arr = batch["tokens"]
    assert isinstance(arr.base, chute.Tensor) and arr.ctypes.data == arr.base.data_ptr


def test_array_interface(source100):
    t = first_tensor(source100)
    ai = t.__array_interface__
    assert ai["version"] == 3 and ai["typestr"] == "<i8" and ai["shape"] == (4, WINDOW)
    assert ai["data"] == (t.data_ptr, False)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "uint16", "int16", "uint32",
                                   "int32", "uint64", "int64", "float16", "float32", "float64"])
def test_numpy_output_is_what_asarray_gives(dtype):
    """The loader's numpy arrays (made through numpy's C API) are what numpy.asarray makes of
    the tensor: same dtype (type included), shape, memory, flags; the tensor their base."""
    rng = np.random.default_rng(0)
    rows = [{"x": (rng.random((3, 2)) * 100).astype(dtype)} for _ in range(5)]
    a = next(iter(chute.Loader(rows, batch_size=5)))["x"]  # output="numpy"
    t = a.base
    assert isinstance(t, chute.Tensor)
    b = np.asarray(t)
    assert a.dtype == b.dtype == np.dtype(dtype) and a.dtype.type is b.dtype.type
    assert a.dtype.char == b.dtype.char and a.shape == b.shape == (5, 3, 2)
    assert a.strides == b.strides and a.ctypes.data == b.ctypes.data == t.data_ptr
    assert a.flags.c_contiguous and a.flags.aligned and a.flags.writeable
    np.testing.assert_array_equal(a, np.stack([r["x"] for r in rows]))
    del t, b
    gc.collect()
    np.testing.assert_array_equal(a, np.stack([r["x"] for r in rows]))  # still alive


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "uint16", "int16", "uint32",
                                   "int32", "uint64", "int64", "float16", "float32", "float64"])
def test_torch_output_is_what_from_dlpack_gives(dtype):
    """output="torch" (made through torch.from_numpy of the array made through numpy's C API,
    DLPack where torch does not take it): what torch.from_dlpack makes of the tensor."""
    torch = pytest.importorskip("torch")
    pa = pytest.importorskip("pyarrow")
    rng = np.random.default_rng(0)
    tbl = pa.table({"x": pa.array((rng.random(5) * 100).astype(dtype))})
    got = next(iter(chute.Loader(chute.arrow(tbl), batch_size=5, output="torch")))["x"]
    t = next(iter(chute.Loader(chute.arrow(tbl), batch_size=5, output="dlpack")))["x"]
    want = torch.from_dlpack(t)
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    assert got.shape == want.shape == (5,) and got.is_contiguous()
    assert torch.equal(got, want)


def test_bfloat16_tensor_to_numpy_says_what_to_do():
    torch = pytest.importorskip("torch")
    rows = [{"h": torch.ones(2, dtype=torch.bfloat16)} for _ in range(2)]
    t = next(iter(chute.Loader(rows, batch_size=2, output="dlpack")))["h"]
    with pytest.raises(BufferError, match="output=.torch"):
        np.asarray(t)


def test_dlpack_shares_memory(source100):
    t = first_tensor(source100)
    assert t.__dlpack_device__() == (1, 0)
    d = np.from_dlpack(t)
    assert d.ctypes.data == t.data_ptr
    np.testing.assert_array_equal(d, np.asarray(t))
    del t
    gc.collect()
    assert d[0, 1] == 1, "the consumer keeps the buffer alive"


def test_dlpack_capsules(source100):
    t = first_tensor(source100)
    legacy = t.__dlpack__()
    assert 'capsule object "dltensor"' in repr(legacy)
    versioned = t.__dlpack__(max_version=(1, 0))
    assert '"dltensor_versioned"' in repr(versioned)
    assert '"dltensor"' in repr(t.__dlpack__(max_version=(0, 8)))
    t.__dlpack__(stream=None, dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError, match="CPU"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    # copy=True: other memory, same values.
    class Copied:
        def __dlpack__(self, **kw):
            return t.__dlpack__(copy=True, **kw)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    c = np.from_dlpack(Copied())
    assert c.ctypes.data != t.data_ptr
    np.testing.assert_array_equal(c, np.asarray(t))


@pytest.mark.parametrize("output", ["numpy", "dlpack"])
def test_buffers_go_back_to_the_pool(source100, output):
    loader = chute.Loader(source100, batch_size=4, num_workers=2, output=output)
    ptrs = []
    for _ in range(3):
        for batch in loader:
            t = batch["tokens"]
            arr = np.from_dlpack(t) if output == "dlpack" else t
            ptrs.append(arr.ctypes.data)
            del batch, t, arr
    assert len(ptrs) == 75
    assert len(set(ptrs)) <= 8, f"{len(set(ptrs))} distinct buffers for 75 batches: not recycled"

    held = [np.asarray(b["tokens"]) for b in loader]
    assert len({a.ctypes.data for a in held}) == 25, "batches held at once never share memory"


def test_unconsumed_capsules_free_their_tensor(source100):
    loader = chute.Loader(source100, batch_size=4, output="dlpack")
    ptrs = set()
    for batch in loader:
        t = batch.pop("tokens")
        ptrs.add(t.data_ptr)
        for _ in range(3):
            t.__dlpack__()  # dropped unconsumed: the destructor frees the managed tensor
            t.__dlpack__(max_version=(1, 0))
        del t
    assert len(ptrs) <= 2, "a capsule that was never consumed must not keep its buffer"


def rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    pytest.skip("no RssAnon in /proc/self/status")


def forever(loader):
    """Batches of epoch after epoch."""
    while True:
        yield from loader


def test_rss_anon_is_flat_over_10000_batches(tmp_path):
    # 1024-token sequences, batches of 16 (131 kB each, 1.3 GB in all), through numpy and
    # DLPack views, with worker threads: anonymous memory after warm-up must not grow.
    np.arange(600 * 1025, dtype=np.uint16).tofile(tmp_path / "big.bin")
    source = chute.tokens(tmp_path / "big.bin", seq_len=1024)
    loader = chute.Loader(source, batch_size=16, shuffle=True, num_workers=2, drop_last=True)
    assert len(loader) == 37
    checksum, warm = 0, None
    for done, batch in enumerate(itertools.islice(forever(loader), 10_000), 1):
        a = batch["tokens"]
        checksum += int(a[0, 0]) - int(np.from_dlpack(a.base)[0, 0])
        if done == 1_000:
            gc.collect()
            warm = rss_anon_kib()
    del batch, a
    gc.collect()
    end = rss_anon_kib()
    assert checksum == 0 and done == 10_000 and loader.stats()["batches"] == 10_000
    assert end - warm < 4 * 1024, f"RssAnon grew by {end - warm} KiB over 9,000 batches"
