"""The README's Python example runs as written."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[2] / "README.md"


def python_example() -> str:
    text = README.read_text()
    section = text[text.index("## In Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.arange(40 * 1025, dtype=np.uint16).tofile("train.bin")  # 40 windows of 1025 tokens
    scope: dict = {}
    exec(compile(python_example(), "README.md", "exec"), scope)
    loader, tokens = scope["loader"], scope["tokens"]
    assert len(loader) == 3 and tokens.dtype == np.int64 and tokens.shape[1] == 1025
    assert scope["x"].shape[1] == scope["y"].shape[1] == 1024
    assert scope["checkpoint"]["epoch"] == 2
