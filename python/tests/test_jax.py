"""JAX takes chute's tensors through DLPack without a copy."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax not installed (scripts/test.sh installs the CPU wheel)")

import chute  # noqa: E402
from conftest import SEQ, write_tokens  # noqa: E402


def test_output_jax_shares_chute_memory(tmp_path):
    # int32: JAX's default integer width (int64 would be narrowed by a copy without x64).
    source = chute.tokens(write_tokens(tmp_path / "t.bin", 8), SEQ, dtype="uint32", out_dtype="int32")
    dl = next(iter(chute.Loader(source, batch_size=4, output="dlpack")))["tokens"]
    x = jax.numpy.from_dlpack(dl)
    assert x.dtype == np.int32 and x.shape == (4, SEQ + 1)
    assert x.unsafe_buffer_pointer() == dl.data_ptr
    np.testing.assert_array_equal(np.asarray(x), np.asarray(dl))

    batch = next(iter(chute.Loader(source, batch_size=4, output="jax")))
    assert isinstance(batch["tokens"], jax.Array)
    assert int(batch["tokens"][1, 0]) == SEQ + 1
