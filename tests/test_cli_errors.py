"""Bad input on the command line gives one line of error and exit status 2, never a traceback,
and the message names what is wrong (no model is loaded: every case fails before that)."""
import os
import subprocess
import sys

import pytest

from mnn_h2o.demo import main as demo_main
from mnn_h2o.gguf_model import ModelFileError
from mnn_h2o.model_source import resolve_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


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
