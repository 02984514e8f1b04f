"""Every X-* header name greenroom reads or sends is written once, in http/core/headers.py."""

from __future__ import annotations

import ast
import pathlib
import re

import greenroom
from greenroom.http.core import headers

ROOT = pathlib.Path(greenroom.__file__).parent
HEADERS = ROOT / "http" / "core" / "headers.py"


def _literals(path: pathlib.Path) -> list[tuple[int, str]]:
    """The string literals (f-string parts too) naming an X-* header, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and re.search(r"\bX-[A-Za-z]", node.value)
    ]


def test_no_header_name_is_written_outside_headers_py():
    outside = {
        f"{path.relative_to(ROOT)}:{line}": text
        for path in ROOT.rglob("*.py")
        if path != HEADERS
        for line, text in _literals(path)
    }
    assert outside == {}


def test_each_name_once():
    names = [v for k, v in vars(headers).items() if k.endswith("_HEADER")]
    assert len(names) == len(set(names)) == len(_literals(HEADERS))
    assert all(n.startswith("X-") for n in names)
