"""The command-line tools live in one place, the package, and each starts as documented:
``python -m mnn_h2o.tools.NAME --help`` from any directory, without PYTHONPATH tricks."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "mnn_h2o", "tools")


def _commands():
    names = []
    for f in sorted(os.listdir(TOOLS)):
        if f.endswith(".py") and f != "__init__.py":
            with open(os.path.join(TOOLS, f), encoding="utf-8") as src:
                if 'if __name__ == "__main__":' in src.read():
                    names.append(f[:-3])
    return names


def test_no_second_tools_directory():
    assert not os.path.exists(os.path.join(ROOT, "tools")), "scripts belong in mnn_h2o/tools/ or scripts/"


@pytest.mark.parametrize("name", _commands())
def test_tool_help(name, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", f"mnn_h2o.tools.{name}", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout
