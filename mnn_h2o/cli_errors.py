"""How every command (export, demo, bench, eval) ends on a user's mistake or Ctrl-C: one line on
stderr and exit status 2 or 130, never a traceback. Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import sys
from typing import Callable

# A user's mistake: a bad value or file. The project's own errors (mnn_h2o/errors.py, and
# config.ConfigError) are ValueErrors, so they are among these (tests/test_cli_errors.py checks).
USER_ERRORS = (ValueError, OSError)


def describe(e: BaseException) -> str:
    if isinstance(e, OSError) and (e.filename or e.strerror):
        return f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}"
    return str(e)


def run(body: Callable[[], int], interrupted: str = "interrupted", lead: str = "") -> int:
    """``body()``'s exit status; a user error prints ``error: ...`` (after ``lead``, e.g. a newline
    after streamed output) and gives 2; Ctrl-C prints ``interrupted`` and gives 130."""
    try:
        return body()
    except KeyboardInterrupt:
        print(f"\n{interrupted}", file=sys.stderr)
        return 130
    except USER_ERRORS as e:
        print(f"{lead}error: {describe(e)}", file=sys.stderr)
        return 2
