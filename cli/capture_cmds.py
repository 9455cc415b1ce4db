"""`segfuse capture`: a PyTorch function as a segfuse graph file (`segfuse.torch.capture` on the
command line), validated, ready to register (`POST /v2/fusions`, `segfuse run --server`).

The function is named as uvicorn names an app: `package.module:function` (importable from the
current directory) or `path/to/file.py:function`. torch.export traces it on example inputs made
from `--example NAME=SHAPExDTYPE` (random values: a trace needs shapes and dtypes only); `--dynamic
NAME=DIM[:SYMBOL]` makes a dim a size symbol, so one graph serves every size of it. torch is
imported only when the command runs (the `torch` extra), never by the rest of the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .common import UserError
from .graph_cmds import print_signature

_EXAMPLE_FORM = "NAME=SHAPExDTYPE, e.g. topk_ids=16x4xint64 (a 0-d tensor: NAME=DTYPE)"
# torch's own names for dtypes, besides segfuse's (int64, float32, ...)
_TORCH_ALIASES = {"long": "int64", "int": "int32", "short": "int16", "float": "float32", "double": "float64",
                  "half": "float16"}
_INT_RANGE = 4  # random integer examples are 0..3: valid indices into any dim of size 4 or more


@dataclass(frozen=True)
class Example:
    text: str  # as given: NAME=SHAPExDTYPE
    name: str
    shape: tuple[int, ...]
    dtype: str  # a segfuse dtype name


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "capture", help="capture a PyTorch function as a graph file (torch.export)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trace a PyTorch function with torch.export on example inputs and write it as a "
                    "segfuse graph (JSON), validated, ready for POST /v2/fusions. Needs PyTorch (the "
                    "torch extra).",
        epilog="examples:\n"
               "  segfuse capture examples/moe_prologue_torch.py:moe_prologue --example topk_ids=16x4xint64 "
               "--dynamic topk_ids=0:T -o moe_prologue_captured.json\n"
               "  segfuse capture examples.moe_prologue_torch:moe_prologue --example topk_ids=16x4xint32 "
               "--name moe_prologue_i32\n\n"
               "Inputs are named after the function's parameters; outputs after the keys of a returned dict,\n"
               "else output_0, output_1, ... . Example values are random (integers 0..3, floats normal): a\n"
               "function whose trace depends on its inputs' values is refused.")
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="the function: package.module:function (importable from the current directory) or "
                        "path/to/file.py:function")
    p.add_argument("--example", "-e", action="append", default=[], metavar="NAME=SHAPExDTYPE",
                   help="an example input for parameter NAME: its sizes and dtype, e.g. topk_ids=16x4xint64 "
                        "(repeatable; one per tensor parameter)")
    p.add_argument("--dynamic", "-d", action="append", default=[], metavar="NAME=DIM[:SYMBOL]",
                   help="make dim DIM of NAME a size symbol (named SYMBOL, else NAME_DIM); one SYMBOL on "
                        "several dims makes them equal (repeatable)")
    p.add_argument("--name", "-n", default=None, help="the graph's name (default: the function's name)")
    p.add_argument("--output", "-o", default="-", metavar="GRAPH.json",
                   help="where the graph goes ('-' or omitted: print it)")
    p.set_defaults(func=cmd_capture)


# ---- the command line's parts ------------------------------------------------------------------
def dtype_names() -> dict[str, str]:
    """Every dtype name --example takes -> the segfuse dtype."""
    from segfuse.compiler.dtypes import DType

    names = {d.value: d.value for d in DType}
    return {**names, **_TORCH_ALIASES}


def parse_example(text: str) -> Example:
    """`NAME=SHAPExDTYPE` ("topk_ids=16x4xint64", "scale=float32")."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or not name or not spec:
        raise UserError(f"--example {text}: expects {_EXAMPLE_FORM}")
    if not name.isidentifier():
        raise UserError(f"--example {text}: '{name}' is not a parameter name")
    names = dtype_names()
    dtype = next((d for d in sorted(names, key=len, reverse=True) if spec == d or spec.endswith("x" + d)), None)
    if dtype is None:
        rest = re.fullmatch(r"(?:\d+x)*(.*)", spec).group(1)
        if not rest or rest.isdigit():
            raise UserError(f"--example {text}: no dtype; give one after the sizes, e.g. {name}={spec}xfloat32")
        raise UserError(f"--example {text}: unknown dtype '{rest}' (dtypes: {', '.join(names)})")
    dims = spec[:len(spec) - len(dtype)].removesuffix("x")
    shape = []
    for d in dims.split("x") if dims else []:
        if not d.isdigit():
            hint = ""
            if d.isidentifier():
                k = len(shape)
                hint = f"; give a size, and make the dim dynamic with --dynamic {name}={k}:{d}"
            raise UserError(f"--example {text}: the sizes of an example are numbers, not '{d}'{hint}")
        shape.append(int(d))
    return Example(text, name, tuple(shape), names[dtype])


def parse_dynamic(text: str, examples: dict[str, Example]) -> tuple[str, int, str | None]:
    """`NAME=DIM[:SYMBOL]` -> (parameter, dim counted from 0, symbol name or None)."""
    name, sep, rest = text.partition("=")
    dim_text, _, symbol = rest.partition(":")
    if not sep or not name or not dim_text:
        raise UserError(f"--dynamic {text}: expects NAME=DIM or NAME=DIM:SYMBOL, e.g. topk_ids=0:T")
    if name not in examples:
        raise UserError(f"--dynamic {text}: '{name}' has no --example (examples: {', '.join(examples) or 'none'})")
    try:
        dim = int(dim_text)
    except ValueError:
        raise UserError(f"--dynamic {text}: the dim '{dim_text}' is not a number") from None
    shape = examples[name].shape
    if not -len(shape) <= dim < len(shape):
        rank = f"{len(shape)} dim{'s' if len(shape) != 1 else ''}"
        raise UserError(f"--dynamic {text}: {name} has {rank} ({_shape_text(shape)}), no dim {dim}")
    dim %= len(shape)
    if symbol and not symbol.isidentifier():
        raise UserError(f"--dynamic {text}: the size symbol '{symbol}' is not a name (letters, digits, _)")
    return name, dim, symbol or None


def _shape_text(shape) -> str:
    return "x".join(map(str, shape)) or "0-d"


@contextlib.contextmanager
def _on_path(directory: str):
    """`directory` first on sys.path while the function is imported and traced (it may import its
    neighbours, at import or at trace time), as `python file.py` would have it."""
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)


def load_function(target: str):
    """The callable `target` names: "pkg.mod:fn", "pkg.mod:Class.method" or "path/file.py:fn"."""
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise UserError(f"{target}: expects MODULE:FUNCTION or path/to/file.py:FUNCTION")
    try:
        if _is_file_path(where):
            module = _import_file(Path(where))
        else:
            module = importlib.import_module(where)
    except UserError:
        raise
    except ModuleNotFoundError as e:
        if e.name and (where == e.name or where.startswith(e.name + ".")):
            raise UserError(f"{target}: no module named '{e.name}' (from the current directory or sys.path)") from None
        raise UserError(f"{target}: importing {where} failed: {_located(e)}") from None
    except Exception as e:  # the user's module failed to import: say what and where, not a traceback
        raise UserError(f"{target}: importing {where} failed: {_located(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{target}: {where} has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{target}: {attr} is {type(obj).__name__}, not a function")
    return obj


def _is_file_path(where: str) -> bool:
    """Whether the part before ':' names a file ("models/routing.py") rather than a module."""
    return where.endswith(".py") or os.sep in where or "/" in where


def _import_file(path: Path):
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    stem = path.stem
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_segfuse_capture_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses and torch look functions' modules up by name)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _located(e: BaseException) -> str:
    """`Type: message (at file:line)` of an exception raised in the user's code."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and not f.filename.startswith("<frozen")]
    at = f" (at {_relative(user[-1].filename)}:{user[-1].lineno})" if user else ""
    return f"{type(e).__name__}: {e}{at}"


def _relative(path: str) -> str:
    """`path` relative to the current directory when it is under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def parameters(fn, target: str, examples: dict[str, Example]) -> list[str]:
    """fn's positional parameters up to the last one with an example (one without an example and
    without a default is an error; a default is passed as the constant it is)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise UserError(f"{target}: its parameters cannot be read (inspect.signature fails)") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional]
    unknown = [ex for n, ex in examples.items() if n not in names]
    if unknown:
        raise UserError(f"--example {unknown[0].text}: {target} has no parameter '{unknown[0].name}' "
                        f"(parameters: {', '.join(names) or 'none'})")
    last = max((names.index(n) for n in examples), default=-1)
    for p in positional[:last + 1]:
        if p.name not in examples and p.default is p.empty:
            raise UserError(f"{target}: parameter '{p.name}' has no --example (give one: --example "
                            f"{p.name}=SHAPExDTYPE)")
    missing = [p.name for p in positional[last + 1:] if p.default is p.empty]
    missing += [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if missing:
        raise UserError(f"{target}: parameter '{missing[0]}' has no --example (give one: --example "
                        f"{missing[0]}=SHAPExDTYPE)")
    return names[:last + 1]


def example_tensor(ex: Example, generator):
    """Random values of the example's shape and dtype (a trace reads shapes and dtypes only)."""
    import torch

    dtype = getattr(torch, ex.dtype)
    if dtype.is_floating_point:
        return torch.randn(ex.shape, generator=generator).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, ex.shape, generator=generator).bool()
    return torch.randint(0, _INT_RANGE, ex.shape, generator=generator).to(dtype)


def _refusal(target: str, e) -> str:
    """A CaptureError as the command says it: the location relative to the current directory, and
    for data-dependent code, that the example values are random."""
    text = str(e)
    if e.location:
        path, _, line = e.location.rpartition(":")
        text = text.replace(f"(at {e.location})", f"(at {_relative(path)}:{line})")
    if e.op == "data-dependent control flow":
        text += (f" (the example inputs are random, integers 0..{_INT_RANGE - 1} and floats normal: "
                 "what is captured must not depend on their values)")
    return f"cannot capture {target}: {text}"


@contextlib.contextmanager
def _quiet_torch():
    """torch.export's own printing (partial graphs, guard errors, deprecation warnings) held back:
    the refusal says what matters, and a printed graph must be the only thing on stdout."""
    import warnings

    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# ---- the command -------------------------------------------------------------------------------
def cmd_capture(args) -> int:
    examples: dict[str, Example] = {}
    for text in args.example:
        ex = parse_example(text)
        if ex.name in examples:
            raise UserError(f"--example {text}: {ex.name} has an example already")
        examples[ex.name] = ex
    if not examples:
        raise UserError(f"give an example input for each tensor parameter: --example {_EXAMPLE_FORM}")
    dynamic: dict[str, dict[int, str | None]] = {}
    for text in args.dynamic:
        name, dim, symbol = parse_dynamic(text, examples)
        dynamic.setdefault(name, {})[dim] = symbol
    if args.name is not None:
        _check_name(args.name)
    try:
        import torch
    except ImportError as e:
        raise UserError(f"segfuse capture needs PyTorch ({e}): install the torch extra, "
                        "pip install -e \".[torch]\" in a clone of segfuse (docs/torch.md)") from None
    from segfuse.compiler import load_fusion
    from segfuse.torch.capturing import CaptureError, capture

    target = args.target
    where = target.rpartition(":")[0]
    directory = str(Path(where).resolve().parent) if _is_file_path(where) else os.getcwd()
    with _on_path(directory):
        with contextlib.redirect_stdout(sys.stderr):  # what the module prints: not into a printed graph
            fn = load_function(target)
        params = parameters(fn, target, examples)
        gen = torch.Generator().manual_seed(0)
        inputs = [example_tensor(examples[p], gen) if p in examples else _default(fn, p) for p in params]
        spec = {p: {d: (s if s is not None else torch.export.Dim.DYNAMIC) for d, s in dims.items()}
                for p, dims in dynamic.items()}
        try:
            with _quiet_torch():
                fd = capture(fn, *inputs, name=args.name, dynamic=spec or None)
        except CaptureError as e:
            raise UserError(_refusal(target, e)) from None
    text = fd.to_json()
    f = load_fusion(text)  # what a server will load: validated here
    if args.output == "-":
        print(text)
        return 0
    try:
        Path(args.output).write_text(text + "\n")
    except OSError as e:
        raise UserError(f"--output {args.output}: {e.strerror}") from None
    print(f"wrote {args.output}: '{f.name}' ({len(f.nodes)} ops, id {f.id})")
    print_signature(f)
    return 0


def _default(fn, param: str):
    return inspect.signature(fn).parameters[param].default


def _check_name(name: str) -> None:
    from pydantic import TypeAdapter, ValidationError
    from segfuse.compiler.schema import GraphName

    try:
        TypeAdapter(GraphName).validate_python(name)
    except ValidationError:
        raise UserError(f"--name {name}: a graph name is 1-128 letters, digits, '_', '.' or '-', starting with "
                        "a letter or '_'") from None

