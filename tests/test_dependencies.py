"""The runtime depends on what it imports and no more: the bench's plots and the offline tools
pull matplotlib and zstandard from the `bench` extra, lazily, so the package imports without them;
the wheel leaves the model-file fuzzer out."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_ONLY = ("matplotlib", "zstandard")


def _pyproject():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _name(requirement):
    return requirement.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()


def test_bench_packages_are_an_extra_the_tests_include():
    project = _pyproject()["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert not runtime & set(BENCH_ONLY)
    assert {_name(r) for r in extras["bench"]} >= set(BENCH_ONLY)
    assert set(extras["bench"]) <= set(extras["test"])


def test_every_module_imports_without_the_bench_extra():
    code = ("import importlib, pkgutil, sys\n"
            f"for m in {BENCH_ONLY!r}: sys.modules[m] = None\n"
            "import mnn_h2o\n"
            "for info in pkgutil.walk_packages(mnn_h2o.__path__, 'mnn_h2o.'):\n"
            "    importlib.import_module(info.name)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr


def test_wheel_exclusions_name_real_files():
    excluded = _pyproject()["tool"]["scikit-build"]["wheel"]["exclude"]
    assert any("fuzz" in e for e in excluded)
    for path in excluded:
        assert os.path.isfile(os.path.join(ROOT, path)), f"pyproject.toml excludes {path}, which does not exist"


def test_runtime_modules_do_not_import_bench_eval_tools_or_serve():
    """docs/architecture.md: the top-level modules are the runtime; bench/, eval/, tools/ and
    serve/ (whose FastAPI and uvicorn are an extra) sit on it. Nor does the runtime import its
    numpy yardstick, reference.py (the float math both use is numpy_ops.py)."""
    import ast

    pkg = os.path.join(ROOT, "mnn_h2o")
    for f in sorted(os.listdir(pkg)):
        if not f.endswith(".py"):
            continue
        with open(os.path.join(pkg, f), encoding="utf-8") as src:
            tree = ast.parse(src.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(filter(None, ("mnn_h2o" if node.level else "", node.module)))
                names = [base + "." + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(("mnn_h2o.bench", "mnn_h2o.eval", "mnn_h2o.tools", "mnn_h2o.serve")), \
                    f"{f} imports {name}"
                assert f in ("reference.py", "stock.py", "stock_export.py") or name != "mnn_h2o.reference", \
                    f"{f} imports the yardstick {name}"


def test_developer_build_installs_the_build_requirements_pin():
    """scripts/setup.sh compiles the module with CMake outside pip's build isolation, so the dev
    extra must carry the same pybind11 as [build-system] (a fresh venv has none of its own)."""
    data = _pyproject()
    build = {_name(r): r for r in data["build-system"]["requires"]}
    dev = {_name(r): r for r in data["project"]["optional-dependencies"]["dev"]}
    assert dev["pybind11"] == build["pybind11"]
    with open(os.path.join(ROOT, "scripts", "setup.sh"), encoding="utf-8") as f:
        assert ".[bench,test,dev]" in f.read()


def test_the_server_says_which_extra_it_needs():
    """python -m mnn_h2o.serve without FastAPI/uvicorn: one clear line, exit status 2."""
    code = ("import sys\n"
            "sys.modules['fastapi'] = None\n"
            "from mnn_h2o.serve.__main__ import main\n"
            "sys.exit(main([]))\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "pip install 'mnn_h2o[serve]'" in p.stderr, p.stderr


def test_the_serve_extra_is_in_the_test_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "redis" in {_name(r) for r in extras["serve"]}
    assert set(extras["serve"]) <= set(extras["test"])


def test_a_redis_store_without_the_redis_client_says_which_extra_it_needs():
    code = ("import sys\n"
            "sys.modules['redis'] = None\n"
            "from mnn_h2o.serve.session_store import open_store\n"
            "try:\n"
            "    open_store('redis://127.0.0.1:6379/0', 1)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "needs the redis client" in p.stdout and "pip install 'mnn_h2o[serve]'" in p.stdout, (p.stdout, p.stderr)
