"""Quiet access to the MNN wheel: it prints banners and converter logs from C, which Python's
sys.stdout cannot catch, so we point the file descriptors themselves elsewhere."""
from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def redirect_fds(path: str = os.devnull, fds=(1, 2)):
    """Point file descriptors ``fds`` (1 = stdout, 2 = stderr) at ``path`` (appended to)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in fds]
    with open(path, "ab") as target:
        for fd in fds:
            os.dup2(target.fileno(), fd)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, keep in zip(fds, saved):
                os.dup2(keep, fd)
                os.close(keep)


def import_mnn():
    """Import MNN (expr, nn, llm) and its converter module ``_tools`` without the CPU-feature
    banner MNN prints at import. Never ``MNN.tools``: it pip-installs a package and phones home."""
    if "MNN.llm" not in sys.modules:
        with redirect_fds():
            import MNN  # noqa: F401
            import MNN.expr  # noqa: F401
            import MNN.llm  # noqa: F401
            import MNN.nn  # noqa: F401
            import _tools  # noqa: F401
    import MNN

    return MNN
