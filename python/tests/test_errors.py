"""Rust errors map to a small exception hierarchy, with the Rust messages."""

import errno
import os

import numpy as np
import pytest

import chute
from conftest import SEQ, write_tokens


def test_hierarchy():
    assert issubclass(chute.ChuteError, Exception)
    for cls in (chute.CorruptDataError, chute.ConfigError, chute.StateError):
        assert issubclass(cls, chute.ChuteError)
    assert issubclass(chute.ConfigError, ValueError)
    assert not issubclass(chute.StateError, ValueError)


def test_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(FileNotFoundError) as e:
        chute.tokens(missing, SEQ)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert "No such file" in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file_is_permission_error(tmp_path):
    path = write_tokens(tmp_path / "secret.bin", 4)
    os.chmod(path, 0)
    with pytest.raises(PermissionError) as e:
        chute.tokens(path, SEQ, dtype="uint32")
    assert e.value.errno == errno.EACCES and e.value.filename == path


def test_a_folder_without_shards_is_a_config_error(tmp_path):
    # A folder stands for the shards inside it (chute.dataset's rule); with none, the error
    # names the folder and what was looked for.
    (tmp_path / "notes.txt").write_text("not tokens")
    with pytest.raises(chute.ConfigError) as e:
        chute.tokens(tmp_path, SEQ)
    assert str(tmp_path) in str(e.value) and ".bin" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=-5), "seq_len"),
        (dict(seq_len=SEQ, dtype="int8"), "dtype"),
        (dict(seq_len=SEQ, dtype="complex"), "dtype"),
        (dict(seq_len=SEQ, out_dtype="float16"), "out_dtype"),
        (dict(seq_len=SEQ, out_dtype="nope"), "out_dtype"),
    ],
)
def test_bad_token_options_are_config_errors(tmp_path, kwargs, option):
    path = write_tokens(tmp_path / "t.bin", 4, dtype=np.uint16)
    with pytest.raises(chute.ConfigError) as e:
        chute.tokens(path, **kwargs)
    assert isinstance(e.value, ValueError)
    assert f"invalid {option}" in str(e.value)


def test_no_paths_is_a_config_error():
    with pytest.raises(chute.ConfigError, match="paths"):
        chute.tokens([], SEQ)


def test_odd_length_file_is_corrupt_data(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02\x00\x03")
    with pytest.raises(chute.CorruptDataError) as e:
        chute.tokens(path, SEQ, dtype="uint16")
    msg = str(e.value)
    assert str(path) in msg and "at byte 5" in msg and "uint16" in msg


def test_foreign_state_is_a_state_error(tmp_path):
    a = chute.Loader(chute.tokens(write_tokens(tmp_path / "a.bin", 10), SEQ, dtype="uint32"))
    b = chute.Loader(chute.tokens(write_tokens(tmp_path / "b.bin", 11), SEQ, dtype="uint32"))
    with pytest.raises(chute.StateError, match="another dataset"):
        b.load_state_dict(a.state_dict())


def test_other_engine_errors_are_chute_errors(source100):
    def ragged(sample):
        # One dimension, then two: no column holds both.
        return {"x": np.zeros((1,) * (sample["__index__"] % 2 + 1))}

    with pytest.raises(chute.ChuteError) as e:
        next(iter(chute.Loader(source100, batch_size=2, transforms=ragged)))
    assert type(e.value) is chute.ChuteError
    assert "sample 1" in str(e.value) and "train.bin" in str(e.value)
