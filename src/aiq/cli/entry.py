"""The console script: signals, the garbage collector, and usage errors as aiq prints errors."""

from __future__ import annotations

import copy
import gc
import os
import signal
import sys
import threading

import typer

# typer's own copy of click (typer >= 0.26, pinned in pyproject.toml): the errors it raises.
from typer._click.exceptions import Abort, ClickException, NoArgsIsHelpError, NoSuchOption
from typer.main import get_command_name

from .app import app


def main() -> None:
    """Console-script entry point."""
    # SIGTERM (cron, systemd, a container stopping) ends a command as Ctrl-C does: files being
    # written are removed, not left half-done. `run` drains on it instead, while it works.
    signal.signal(signal.SIGTERM, _terminated)
    # The cyclic GC's first threshold, 700 allocations, ran it ~500 times in a run at 500
    # requests/s, each pass walking the objects of ~1,500 calls in flight: 8% of aiq's CPU
    # (bench/README.md, "CPU at 500 requests/s"). At 50,000 it runs ~12 times, for ~0.4%.
    # Set here, for the aiq process: the library leaves its caller's GC alone.
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
    try:
        # Not standalone: a usage error comes back here, to be printed as aiq prints errors
        # (typer's own way is a rich box), and typer.Exit comes back as its exit code.
        code = app_for(sys.argv[1:])(prog_name="aiq", standalone_mode=False)
    except ClickException as exc:
        code = _usage_error(exc)
    except Abort:  # end of input at a prompt; aiq has none, but typer may raise it
        print("error: aborted", file=sys.stderr)
        code = 1
    finally:
        if _signalled:
            # Files being written are gone by now (their context managers ran as SystemExit
            # unwound). A store the signal cut off before it closed leaves aiosqlite's thread
            # (not a daemon) waiting for work, and the interpreter would wait for it at exit:
            # an export stopped by SIGTERM hung instead of exiting (tests/test_bad_env.py).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def app_for(args: list[str]) -> typer.Typer:
    """``app`` with only the command ``args`` start with, if they name one. typer turns every
    registered command into click's on each start (reading its signature, making each option):
    ~14 ms for aiq's twelve, a tenth of `aiq status` (bench/README.md, "Start-up"). A
    command's run, help and usage errors read nothing of the others; anything else (`aiq`,
    `--version`, a mistyped command and its suggestion) gets the whole app."""
    chosen = [
        c for c in app.registered_commands
        if args and c.callback and (c.name or get_command_name(c.callback.__name__)) == args[0]
    ]  # fmt: skip
    if not chosen:
        return app
    one = copy.copy(app)
    one.registered_commands = chosen
    return one


_signalled = False
# After a signal, the process is gone within this long whatever its unwinding waits for. An
# export stopped by SIGTERM once hung past 30 s under a loaded CI run (tests/test_bad_env.py,
# not reproduced in 24 runs since): some wait as SystemExit unwound kept it from main's exit
# below. A temporary file it leaves is removed by the next write (aiq.files, its pid gone).
_GRACE_S = 10.0


def _terminated(signum: int, frame: object) -> None:
    # 130 for any signal, as for Ctrl-C and as `run` exits when a signal stops it (DESIGN.md's
    # exit codes): a wrapper must not see 143 or 130 depending on when SIGTERM landed.
    global _signalled
    if not _signalled:
        watchdog = threading.Timer(_GRACE_S, os._exit, (130,))
        watchdog.daemon = True  # (the normal exit does not wait for it)
        watchdog.start()
    _signalled = True
    raise SystemExit(130)


# Flags people try for the API key; aiq takes keys from the environment only.
_KEY_FLAGS = frozenset({"--api-key", "--key", "--openai-api-key", "--anthropic-api-key"})


def _usage_error(exc: ClickException) -> int:
    """Print a usage error as one ``error: …`` line with where to look; its exit code (2)."""
    if isinstance(exc, NoArgsIsHelpError):  # bare `aiq`: the help, on stdout as --help
        print(exc.format_message())
        return exc.exit_code
    if isinstance(exc, NoSuchOption) and exc.option_name in _KEY_FLAGS:
        message = (
            f"aiq takes no {exc.option_name}: it reads the key from $OPENAI_API_KEY "
            "($ANTHROPIC_API_KEY with --provider anthropic, or the variable the config's "
            "api_key_env names); it never takes a key on the command line, where shell "
            "history and `ps` would show it"
        )
    else:
        message = exc.format_message().rstrip(".")
        message = message[:1].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    return exc.exit_code
