"""The layering rules: the front end never imports torch; the scheduling policy never imports
the runtime; engines never import the actor runtime or the web stack."""

import ast
import subprocess
import sys

from conftest import ROOT


def imported_after(modules: list[str]) -> set[str]:
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_front_end_and_supervisor_do_not_import_torch():
    loaded = imported_after(["greenroom.http.core.app", "greenroom.supervisor.serve", "greenroom.cli"])
    assert not loaded & {"torch", "transformers", "tokenizers", "safetensors"}


def test_the_scheduling_policy_imports_no_runtime():
    assert not imported_after(["greenroom.actors.scheduling"]) & {"trio", "tractor", "torch", "quart"}


def test_engines_do_not_import_the_runtime_or_web_stack():
    # read the source: a third-party package may load trio on its own (httpcore does)
    forbidden = {"trio", "tractor", "quart", "quart_trio", "hypercorn", "greenroom"}
    for path in (ROOT / "greenroom" / "engines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
