"""Nothing in the project may import MNN.tools: importing it pip-installs an unrelated package
into the system Python and sends telemetry."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


def _imports_mnn_tools(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "MNN.tools" or a.name.startswith("MNN.tools.")
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom):
            if node.module and (node.module == "MNN.tools" or node.module.startswith("MNN.tools.")):
                return True
            if node.module == "MNN" and any(a.name == "tools" for a in node.names):
                return True
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            if any(isinstance(a, ast.Constant) and str(a.value).startswith("MNN.tools") for a in node.args):
                return True
    return False


def test_detector_catches_every_spelling():
    for src in ("import MNN.tools", "from MNN.tools import mnnconvert", "from MNN import tools",
                "import importlib; importlib.import_module('MNN.tools')", "__import__('MNN.tools.x')"):
        assert _imports_mnn_tools(ast.parse(src)), src
    assert not _imports_mnn_tools(ast.parse("import _tools\nimport MNN.expr"))


def test_no_source_file_imports_mnn_tools():
    offenders = []
    this = os.path.abspath(__file__)
    for path in _python_files():
        if os.path.abspath(path) == this:
            continue
        with open(path, encoding="utf-8") as f:
            if _imports_mnn_tools(ast.parse(f.read(), path)):
                offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, f"these files import MNN.tools: {offenders}"


def test_importing_every_module_leaves_mnn_tools_unloaded():
    code = ("import pkgutil, importlib, sys, mnn_h2o\n"
            "for m in pkgutil.walk_packages(mnn_h2o.__path__, 'mnn_h2o.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    importlib.import_module(m.name)\n"
            "from mnn_h2o.mnn_runtime import import_mnn; import_mnn()\n"
            "bad = [k for k in sys.modules if k.startswith('MNN.tools')]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
