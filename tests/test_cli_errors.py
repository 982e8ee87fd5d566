"""Bad input on the command line gives one line of error and exit status 2, never a traceback,
and the message names what is wrong (no model is loaded: every case fails before that)."""
import os
import subprocess
import sys

import pytest

from mnn_h2o.demo import main as demo_main
from mnn_h2o.errors import ModelFileError
from mnn_h2o.model_source import resolve_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def _project_errors():
    import inspect

    from mnn_h2o import errors
    from mnn_h2o.config import ConfigError

    found = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(found) >= 4
    return found + [ConfigError]


@pytest.mark.parametrize("error", _project_errors(), ids=lambda c: c.__name__)
def test_every_project_error_is_a_users_mistake(capsys, error):
    """cli_errors.run reports each of the project's errors in one line, exit status 2 (a traceback
    would mean one was left out of cli_errors.USER_ERRORS)."""
    from mnn_h2o.cli_errors import run

    def body():
        raise error("what went wrong")

    assert run(body) == 2
    assert capsys.readouterr().err == "error: what went wrong\n"


def test_a_bug_keeps_its_traceback():
    from mnn_h2o.cli_errors import run

    def body():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run(body)


@pytest.mark.parametrize("gguf, message", [("/missing/file.gguf", "model file not found: /missing/file.gguf"),
                                           ("/", "/ is a directory, not a GGUF file")])
def test_export_of_a_missing_file(gguf, message):
    p = _run("mnn_h2o.export", "--gguf", gguf)
    assert p.returncode == 2
    assert p.stderr.strip() == f"error: {message}"


@pytest.mark.parametrize("model", ["/missing/file.gguf", "missing.gguf", "models/x"])
def test_a_path_that_does_not_exist_is_not_an_unknown_model(model):
    with pytest.raises(ModelFileError, match=f"model file not found: {model}$"):
        resolve_gguf(model)


def _demo_error(capsys, *argv):
    assert demo_main(list(argv)) == 2
    return capsys.readouterr().err.strip()


def test_demo_missing_model_file(capsys):
    assert _demo_error(capsys, "--prompt", "hi", "--model", "/missing/file.gguf") == \
        "error: model file not found: /missing/file.gguf"


@pytest.mark.parametrize("chat", [[], ["--no-chat"]])
@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_demo_empty_prompt_is_an_error_with_or_without_chat(capsys, tmp_path, chat, prompt):
    assert _demo_error(capsys, "--prompt", prompt, *chat) == "error: the prompt (--prompt) is empty"
    f = tmp_path / "empty.txt"
    f.write_text(prompt)
    assert _demo_error(capsys, "--prompt-file", str(f), *chat) == f"error: the prompt (--prompt-file {f}) is empty"


def test_demo_binary_prompt_file_names_the_file(capsys, tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"GGUF\x03\x00\x00\x00\xe8\x00\xff" * 10)
    err = _demo_error(capsys, "--prompt-file", str(f))
    assert err.startswith(f"error: --prompt-file {f} is not UTF-8 text: ")
    assert _demo_error(capsys, "--prompt-file", str(tmp_path / "none.txt")) == \
        f"error: cannot read --prompt-file {tmp_path / 'none.txt'}: No such file or directory"
