"""The `segfuse` command line. Each command group lives in its own module and registers itself
through `add_parser(subparsers)`; `main` dispatches and maps user errors to exit status 2."""

from __future__ import annotations

import argparse
import os
import sys

from segfuse.compiler.errors import SegfuseError

from . import (
    capture_cmds,
    client_cmds,
    fusion_cmds,
    graph_cmds,
    plan_cmds,
    region_cmds,
    route_cmd,
    serve_cmd,
    serve_ray_cmd,
)
from .common import UserError  # noqa: F401  (re-exported: segfuse.cli.UserError)

# Modules that add sub-commands; each has add_parsers(subparsers).
COMMAND_MODULES = [graph_cmds, capture_cmds, client_cmds, fusion_cmds, region_cmds, serve_cmd, serve_ray_cmd, route_cmd, plan_cmds]

EPILOG = """examples:
  segfuse validate examples/moe_problem_sizes.json
  segfuse run examples/moe_problem_sizes.json --input topk_ids=ids.npy --output counts=counts.npy
"""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("segfuse")
    except Exception:  # a source tree that is not installed
        return "0.0.0 (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="segfuse", description="Segmented fusion executor: validate, plan and run "
                                "tensor fusion graphs.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"segfuse {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_MODULES:
        mod.add_parsers(sub)
    return p


# What a process killed by SIGPIPE reports to the shell (128 + 13), as `cat`, `git` and others do.
EXIT_BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`segfuse ... | head`): no traceback. stdout is pointed at devnull so
        # the interpreter's last flush of what is still buffered does not fail again (the recipe of
        # Python's signal docs, "Note on SIGPIPE").
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a descriptor (captured in a test)
            pass
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, usage errors: their text is flushed here too
        sys.stdout.flush()
        raise
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not at exit
        return status
    except SegfuseError as e:
        print(f"error: {type(e).__name__}", file=sys.stderr)
        for issue in e.issues:
            print(f"  {issue}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
