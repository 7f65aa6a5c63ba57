"""The README's Python examples run as written (in order, one namespace)."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run():
    blocks = python_blocks()
    assert len(blocks) >= 4
    namespace: dict = {}
    for index, block in enumerate(blocks):
        code = compile(block, f"README.md, python block {index}", "exec")
        exec(code, namespace)  # noqa: S102  (our own README)
