"""The `nnschemaparser` command (also `neurarch-trace`): inspect a model from the shell and export what the run saw.

    nnschemaparser TARGET --input 2,16 [--input 2,8:long ...] [-o out.neurarch.json] [--format neurarch|nnsp]
                   [--dump schema.txt] [--trace trace.txt] [--summary] [--card] [--depth N] [--verbose]
                   [--plan [--batch-size N --precision fp16 --mode training --optimizer adam
                    --epoch-samples N --gpu-table FILE.json --plan-json FILE] [--base OTHER.neurarch.json]
                    [--fail-on-block] [--api URL] [--share [--share-source]]]

TARGET is `path/to/file.py:Name`, `package.module:Name` or `hf:<model_type>` (see target.py). Each
--input is one positional input of forward: its shape, and optionally `:dtype`. The model is put in
eval mode, random inputs are drawn from a fixed seed, and everything runs locally on CPU with
autograd enabled (as neurarch-trace's trace runs; the values are the same bit for bit as under no_grad).

The graph is always written: to -o, else to `<Name>.neurarch.json` (`<Name>.nnsp.json` with
`--format nnsp`) in the current directory, said on stderr. `--format neurarch` (the default) is
the neurarch-trace file (neurarch_graph.py), `--format nnsp` the project's richer graph
(graph_export.py).

`--plan` prints the plan card (plan.py) computed here from the neurarch graph; nothing leaves the
machine unless `--api URL` (or `NEURARCH_API`) names a deployment (`nnschemaparser serve`), which
then computes the card (`NEURARCH_API_KEY` is sent as a bearer token); `--share` (needs a
deployment) stores the graph there and prints `Share: URL` last. `--base`, `--share` and
`--fail-on-block` imply `--plan`. What is sent (docs/CLI.md, "Privacy"): the graph as
`neurarch_graph.outgoing_graph` makes it (layer types, shapes, hyperparameters, module paths and the
target string; no weights, no source, no opaque reasons or failure messages), the base graph the
same way, the options and the file part of the target. Only `--share --share-source` adds the
model's schema document (the lowered forward: variable names, source text, file names relative to
here, shapes and dtypes; no weights), made by `share_schema`, which the root `__main__` passes
(widget.shared_page.share_document: this stage may not import the files or widget stages); the
deployment's page of such a share opens it in the inspector.

stdout carries only what was asked for (the summary, `-o -`, the cards, the Share line; the card
alone when nothing is asked); progress and notices go to stderr. Exit status, as neurarch-trace
defines it: 0 on success; 1 on any failure and on bad usage (one line on stderr; the traceback with
--verbose; a model whose forward fails still gets its card, saying so; the model's own `sys.exit`
is such a failure, ModelExit, and so is its GeneratorExit or own BaseException subclass, ModelAbort);
130 when interrupted (Ctrl-C, KeyboardInterrupt: one line, `interrupted`); 2 only with
`--fail-on-block` when the card reports a blocker. With `--plan`, a forward that fails is a blocker the card reports and the exit status is 0 once the card
printed; a network failure, rate limit or server error of the deployment is one line on stderr and
exit status 1, with the graph file already on disk.

Depends on target, inspector, graph_export, neurarch_graph, plan, plan_client, gpu_table, card,
flops, equality, dump and text_trace; nothing depends on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TextIO

import torch
from torch import nn

from .card import format_card, format_failure_card
from ..schema.dump import dump_schema
from ..parser.equality import first_mismatch
from .flops import count_forward_flops
from .gpu_table import load_table
from .graph_export import build_graph, write_graph
from .inspector import ModelInspector
from .neurarch_graph import build_neurarch_graph, default_graph_path, failure_graph, outgoing_graph, read_graph
from .plan import IMAGENET_1K_TRAIN, OPTIMIZER_STATE_BYTES, PlanOptions, compute_plan, format_plan_card
from .plan_client import request_plan
from .target import LoadedTarget, load_target
from ..traces.text_trace import TraceRecorder

__all__ = ["main", "InputSpec", "parse_input_spec", "make_inputs", "USAGE_STATUS", "INTERRUPTED_STATUS", "ModelExit",
           "ModelAbort"]

_DTYPES = {
    "float": torch.float32, "float32": torch.float32, "fp32": torch.float32,
    "double": torch.float64, "float64": torch.float64,
    "half": torch.float16, "float16": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "long": torch.int64, "int64": torch.int64,
    "int": torch.int32, "int32": torch.int32,
    "short": torch.int16, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
_DEFAULT_TOKEN_RANGE = 1000


@dataclass(frozen=True)
class InputSpec:
    """One --input: a shape and, when given with `:dtype`, its dtype (else the --dtype default)."""

    shape: tuple[int, ...]
    dtype: Optional[torch.dtype]
    text: str


def _dtype(name: str) -> torch.dtype:
    key = name.strip().lower().replace("torch.", "")
    if key not in _DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}; use one of {', '.join(sorted(set(_DTYPES)))}")
    return _DTYPES[key]


def parse_input_spec(text: str) -> InputSpec:
    """`2,16` -> shape (2, 16); `2,8:long` -> shape (2, 8) of int64."""
    shape_text, sep, dtype_text = text.partition(":")
    try:
        shape = tuple(int(part) for part in shape_text.split(",") if part.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input {text!r}: the shape must be comma-separated whole numbers, "
                                         "e.g. 2,16 or 2,8:long") from None
    if not shape or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"--input {text!r}: give at least one dimension, none negative, "
                                         "e.g. 2,16")
    return InputSpec(shape=shape, dtype=_dtype(dtype_text) if sep else None, text=text)


def _token_range(target: LoadedTarget, override: Optional[int]) -> int:
    if override is not None:
        return override
    if target.token_range is not None:
        return target.token_range
    # An integer input usually indexes an embedding: stay inside the smallest one.
    sizes = [m.num_embeddings for m in target.model.modules() if isinstance(m, nn.Embedding)]
    return min([_DEFAULT_TOKEN_RANGE, *sizes])


def make_inputs(specs: Sequence[InputSpec], default_dtype: torch.dtype, token_range: int,
                seed: int = 0) -> list[torch.Tensor]:
    """Random tensors for the specs: randn for floats, randint(0, token_range) for integers."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in specs:
        dtype = spec.dtype or default_dtype
        if dtype == torch.bool:
            tensor = torch.randint(0, 2, spec.shape, generator=generator).bool()
        elif dtype.is_floating_point:
            tensor = torch.randn(spec.shape, generator=generator).to(dtype)
        else:
            tensor = torch.randint(0, max(1, token_range), spec.shape, generator=generator).to(dtype)
        tensors.append(tensor)
    return tensors


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are `_Usage` (one line, exit status USAGE_STATUS) instead of exit 2."""

    def error(self, message: str):  # type: ignore[override]
        raise _Usage(message)


def _argument_parser(prog: str = "nnschemaparser") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Parse a PyTorch model into its schema, run it once on random inputs and report what ran.",
        epilog="Examples: nnschemaparser models.py:MLP --input 2,16 --card ; "
               "nnschemaparser hf:bert --summary -o bert.json")
    parser.add_argument("target", metavar="TARGET",
                        help="path/to/file.py:Name, package.module:Name or hf:<model_type>")
    parser.add_argument("--input", action="append", type=parse_input_spec, metavar="SHAPE[:DTYPE]",
                        help="shape of one positional forward input, e.g. 2,16 or 2,8:long (repeat per input; "
                             "hf: targets default to 1,16:long)")
    parser.add_argument("--dtype", type=_dtype, default=None, metavar="DTYPE",
                        help="dtype of inputs given without :dtype (default float32)")
    parser.add_argument("--token-range", type=int, default=None, metavar="N",
                        help="integer inputs are drawn from [0, N) (default: the vocabulary size of hf: "
                             "targets, else the smallest nn.Embedding, at most 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("-o", "--output", metavar="GRAPH.json",
                        help="write the JSON graph there ('-': stdout; default <Name>.neurarch.json here)")
    parser.add_argument("--format", choices=("neurarch", "nnsp"), default="neurarch",
                        help="the graph file: neurarch (one node per layer, the default) or nnsp (every op)")
    parser.add_argument("--dump", metavar="SCHEMA.txt", help="write the schema dump there")
    parser.add_argument("--trace", metavar="TRACE.txt", help="write the text trace of the run there")
    parser.add_argument("--summary", action="store_true", help="print the module tree with every op")
    parser.add_argument("--card", action="store_true", help="print the boxed card (the default output)")
    parser.add_argument("--depth", type=int, default=None, metavar="N",
                        help="in the JSON graph, merge every module N levels below the root into one node")
    parser.add_argument("--name", default=None, help="the model's name in the graph and the card")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="ANSI colours in the summary (default: when stdout is a terminal)")
    parser.add_argument("--verbose", action="store_true", help="show the traceback on a failure")
    plan = parser.add_argument_group("plan card", "computed here unless --api/NEURARCH_API names a deployment")
    plan.add_argument("--plan", action="store_true", help="print the plan card: runs, GPU fit, cost, warnings")
    plan.add_argument("--base", metavar="OTHER.neurarch.json", help="add a diff against this graph (implies --plan)")
    plan.add_argument("--fail-on-block", action="store_true",
                      help="exit 2 when the card reports a blocker (implies --plan)")
    plan.add_argument("--share", action="store_true",
                      help="store the graph (layer types, shapes, hyperparameters; no weights, no source) at a "
                           "public unguessable URL of the deployment: anyone with the link can open it "
                           "(implies --plan)")
    plan.add_argument("--share-source", action="store_true",
                      help="with --share, also upload the model's schema: its forward's source text, variable "
                           "names, file names, shapes and dtypes (no weights); the share then opens in the inspector")
    plan.add_argument("--share-graph-only", action="store_true",
                      help="with --share, upload the graph only (the default; kept for older scripts)")
    plan.add_argument("--api", metavar="URL", default=None,
                      help="the deployment to ask (default: $NEURARCH_API; none: computed locally)")
    plan.add_argument("--batch-size", type=int, default=32, metavar="N", help="batch size to plan for (default 32)")
    plan.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp16",
                      help="precision to plan for (default fp16)")
    plan.add_argument("--mode", choices=("training", "inference"), default="training",
                      help="plan training (gradients, optimizer state) or inference (default training)")
    plan.add_argument("--optimizer", choices=tuple(OPTIMIZER_STATE_BYTES), default="adam",
                      help="optimizer whose state is counted when training (default adam)")
    plan.add_argument("--epoch-samples", type=int, default=IMAGENET_1K_TRAIN, metavar="N",
                      help=f"samples in one epoch (default {IMAGENET_1K_TRAIN}, ImageNet-1k's training set)")
    plan.add_argument("--gpu-table", metavar="FILE.json", help="override GPU memory, FLOP rates and prices")
    plan.add_argument("--plan-json", metavar="FILE.json", help="also write the plan (with the diff) as JSON there")
    return parser


class _Usage(Exception):
    """Bad usage (argparse's or found after it): one line on stderr and exit status USAGE_STATUS."""


#: The exit status of bad usage: a failure (1), never 2, which `--fail-on-block` reserves for a blocker.
USAGE_STATUS = 1


#: The exit status of an interrupted command (Ctrl-C, a KeyboardInterrupt): the shell's 128 + SIGINT.
INTERRUPTED_STATUS = 130


class ModelExit(RuntimeError):
    """The model's code (its import, construction or forward) called sys.exit: a failure, not a way out."""


class ModelAbort(RuntimeError):
    """The model's code raised a BaseException that is not an Exception (GeneratorExit, its own
    `class Boom(BaseException)`), KeyboardInterrupt and SystemExit aside: a failure like any other."""


_PROG = ["nnschemaparser"]


def _note(stderr: TextIO, text: str) -> None:
    print(f"{_PROG[0]}: {text}", file=stderr)


def _check_usage(args: argparse.Namespace) -> None:
    if args.depth is not None and args.depth < 0:
        raise _Usage("--depth must be 0 or more")
    if args.token_range is not None and args.token_range < 1:
        raise _Usage("--token-range must be 1 or more")
    if not args.input and not args.target.startswith("hf:"):
        raise _Usage(f"{args.target} needs its inputs: add --input SHAPE[:DTYPE] once per positional input, "
                     "e.g. --input 2,16")
    args.plan = args.plan or bool(args.base) or args.share or args.fail_on_block
    args.api = args.api or os.environ.get("NEURARCH_API") or None
    if args.plan and args.output == "-":
        raise _Usage("-o - writes the graph to stdout, which the plan card needs: give -o a file name")
    if args.share_graph_only and not args.share:
        raise _Usage("--share-graph-only only changes what --share uploads: add --share")
    if args.share_source and not args.share:
        raise _Usage("--share-source only changes what --share uploads: add --share")
    if args.share_source and args.share_graph_only:
        raise _Usage("--share-source uploads the schema and --share-graph-only refuses it: give one of them")
    if args.share and not args.api:
        raise _Usage("--share stores the graph on a deployment: give --api URL or set NEURARCH_API "
                     "(run one with: nnschemaparser serve)")
    if args.batch_size < 1:
        raise _Usage("--batch-size must be 1 or more")
    if args.epoch_samples < 1:
        raise _Usage("--epoch-samples must be 1 or more")


def _plan_options(args: argparse.Namespace) -> PlanOptions:
    table = load_table(args.gpu_table) if args.gpu_table else None
    extra = {"table": table} if table is not None else {}
    return PlanOptions(batch_size=args.batch_size, precision=args.precision, mode=args.mode,
                       optimizer=args.optimizer, epoch_samples=args.epoch_samples, **extra)


def _write_graph_file(args: argparse.Namespace, graph: dict, name: str, stdout: TextIO, stderr: TextIO) -> None:
    if args.output == "-":
        stdout.write(json.dumps(graph, indent=1) + "\n")
        return
    path = args.output or default_graph_path(name, ".nnsp.json" if args.format == "nnsp" else ".neurarch.json")
    write_graph(graph, path)
    _note(stderr, f"wrote {path} ({len(graph['nodes'])} nodes, {len(graph['edges'])} edges)")


def _print_plan(args: argparse.Namespace, graph: dict, base: Optional[dict], options: PlanOptions,
                source: str, stdout: TextIO, stderr: TextIO, schema: Optional[dict] = None) -> int:
    """Print the plan card (and the Share line); the exit status the card calls for."""
    share_url = None
    if args.api:
        shared = " and to share it at a public URL" + (
            " with its schema (the forward's source)" if schema is not None else "") if args.share else ""
        _note(stderr, f"sending the graph (layer types, shapes and hyperparameters; no weights) to {args.api} "
                      f"for its plan{shared}")
        answer = request_plan(args.api, outgoing_graph(graph), base=outgoing_graph(base) if base else None,
                              target=args.target, source=source, options=options,
                              api_key=os.environ.get("NEURARCH_API_KEY") or None, share=args.share,
                              schema=schema if args.share else None)
        plan, card = answer["plan"], answer["card"]
        share_url = answer.get("shareUrl")
    else:
        plan = compute_plan(graph, options, base=base)
        card = format_plan_card(plan, source=source)
    if args.plan_json:
        write_graph(plan, args.plan_json)
        _note(stderr, f"wrote {args.plan_json}")
    stdout.write(card)
    if share_url:
        stdout.write(f"Share: {share_url}\n")
    return 2 if args.fail_on_block and plan.get("blockers") else 0


def _shared_schema(args: argparse.Namespace, inspector: ModelInspector, share_schema: Optional[Callable[[Any], dict]],
                   stderr: TextIO) -> Optional[dict]:
    """The schema document `--share --share-source` uploads, or None (the graph only: the default)."""
    if not (args.share and args.share_source):
        return None
    if share_schema is None:
        _note(stderr, "notice: this entry point cannot encode the schema; sharing the graph only")
        return None
    try:
        return share_schema(inspector.schema)
    except Exception as exc:  # a schema the file format cannot hold: the share still has its graph
        _note(stderr, f"notice: the schema cannot be shared ({_one_line(exc)}); sharing the graph only")
        return None


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO,
         share_schema: Optional[Callable[[Any], dict]] = None) -> int:
    _check_usage(args)
    options = _plan_options(args) if args.plan else None
    base = read_graph(args.base) if args.base else None
    _note(stderr, f"loading {args.target}")
    target = _guarded(load_target, args.target)
    model = target.model.eval()
    specs = list(args.input or [parse_input_spec(text) for text in target.default_inputs])
    inputs = make_inputs(specs, args.dtype or torch.float32, _token_range(target, args.token_range), args.seed)
    name = args.name or target.name
    _note(stderr, f"parsing and running {name} on " + ", ".join(
        f"{'x'.join(map(str, t.shape))} {str(t.dtype).replace('torch.', '')}" for t in inputs))
    tracer = TraceRecorder() if args.trace else None
    wants_card = args.card or not (args.summary or args.output or args.dump or args.trace or args.plan)
    try:
        # the seed's trace: eval() mode, CPU, autograd enabled (attribution follows the autograd graph)
        inspector = _guarded(ModelInspector, model, example_inputs=tuple(inputs),
                             listeners=[tracer] if tracer else (), autograd=True)
    except Exception as exc:
        if wants_card:  # the card says the model does not run; the failure line still goes to stderr
            stdout.write(format_failure_card(model, exc, name=name, source=target.source,
                                             inputs=", ".join(spec.text for spec in specs)))
        if not args.plan:
            raise
        # With --plan the failing forward is the card's blocker: the graph says so and is written.
        _note(stderr, f"the forward does not run: {_one_line(exc)}")
        graph = failure_graph(model, exc, name=name, target=args.target, inputs=[spec.text for spec in specs])
        if args.format == "neurarch":
            _write_graph_file(args, graph, name, stdout, stderr)
        else:
            _note(stderr, "no nnsp graph written: it needs a forward that runs")
        return _print_plan(args, graph, base, options, target.source, stdout, stderr)
    for path, reason in inspector.schema.skipped.items():
        _note(stderr, f"notice: {path} runs eagerly as one piece ({reason.splitlines()[0]})")

    if args.dump:
        dump_schema(inspector.schema, args.dump)
        _note(stderr, f"wrote {args.dump}")
    if tracer is not None:
        tracer.save(args.trace)
        _note(stderr, f"wrote {args.trace}")
    if args.summary:
        colorize = args.color == "always" or (args.color == "auto" and stdout.isatty())
        stdout.write(inspector.format_summary(colorize=colorize))
    graph_args = dict(name=name, target=args.target, depth=args.depth, inputs=[spec.text for spec in specs])
    neurarch = build_neurarch_graph(inspector, **graph_args) if args.format == "neurarch" or args.plan else None
    graph = neurarch if args.format == "neurarch" else build_graph(inspector, **graph_args)
    _write_graph_file(args, graph, name, stdout, stderr)
    if wants_card:
        _, eager = _guarded(count_forward_flops, model, [t.clone() for t in inputs], autograd=True)
        stdout.write(format_card(inspector, name=name, source=target.source,
                                 matches_eager=first_mismatch(eager, inspector.result) is None))
    if args.plan:
        return _print_plan(args, neurarch, base, options, target.source, stdout, stderr,
                           schema=_shared_schema(args, inspector, share_schema, stderr))
    return 0


def _guarded(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call into the model's code; its sys.exit is a ModelExit and any other BaseException but
    KeyboardInterrupt a ModelAbort (failures with one line, reported as a forward's Exception is),
    never the CLI's exit or a traceback."""
    try:
        return function(*args, **kwargs)
    except SystemExit as exc:
        raise ModelExit(f"the model's code called sys.exit({exc.code!r}); a model must raise, not exit") from None
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        where = _where(exc)
        raise ModelAbort(f"the model's code raised {_one_line(exc)}, a BaseException that is not an Exception"
                         + (f" ({where})" if where else "")) from exc


def _where(exc: BaseException) -> str:
    """Where `exc` was raised: the interpreter's note (`while executing ... in Net.forward at m.py:9`),
    else the innermost frame of its traceback."""
    for note in getattr(exc, "__notes__", None) or ():
        if isinstance(note, str) and note.startswith("while executing"):
            return note.splitlines()[0][:300]
    frames = traceback.extract_tb(exc.__traceback__)
    return f"at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def main(argv: Optional[Sequence[str]] = None, *, share_schema: Optional[Callable[[Any], dict]] = None,
         prog: str = "nnschemaparser") -> int:
    """Run the command with `argv` (default: sys.argv[1:]); returns the exit status: 0 success, 1 any
    failure or bad usage (one line on stderr), 2 only for `--fail-on-block` with a blocker.
    `share_schema` turns a schema into the document `--share --share-source` uploads with the graph
    (None: the graph only); `prog` names the command in its messages (`neurarch-trace`)."""
    parser = _argument_parser(prog)
    _PROG[0] = prog
    stdout, stderr = sys.stdout, sys.stderr
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version: argparse printed them
        return exc.code if isinstance(exc.code, int) else 0
    except _Usage as exc:
        print(f"{prog}: error: {exc} (see {prog} --help)", file=stderr)
        return USAGE_STATUS
    try:
        return _run(args, stdout, stderr, share_schema)
    except _Usage as exc:
        print(f"{prog}: error: {exc} (see {prog} --help)", file=stderr)
        return USAGE_STATUS
    except KeyboardInterrupt:  # Ctrl-C: the shell's convention, never a traceback
        if args.verbose:
            traceback.print_exc(file=stderr)
        print(f"{prog}: interrupted", file=stderr)
        return INTERRUPTED_STATUS
    except BaseException as exc:  # GeneratorExit and other BaseExceptions too: one line, never a traceback
        if args.verbose:
            traceback.print_exc(file=stderr)
        unusual = isinstance(exc, ModelAbort) or not isinstance(exc, Exception)
        hint = " (--verbose shows the traceback)" if unusual and not args.verbose else ""
        print(f"{prog}: error: {_one_line(exc)}{hint}", file=stderr)
        return 1
