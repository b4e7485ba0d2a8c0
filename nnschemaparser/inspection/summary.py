"""The text view of an inspection run: the module tree with every op's connectivity.

    (pkg.MyModel)
        module inputs:  {0: [linear1.linear[0]]}
    ├── ■ linear1 (torch.nn.modules.linear.Linear)
    │   └── ◆ linear1.linear [linear]
    │         op inputs:  {0: input_0}
    │         op states:  weight, bias

Modules and ops of one parent are listed in the order the run first reached them; modules the run
never entered (an MoE expert no token was routed to) come last. ANSI colours are optional. By default the lines are those of the inspector spec: the legend, then
per module its boundary, per op its inputs, states, outputs and `filepath:` (the op's call site in
model code, as `op.call_site` finds it, relative to the working directory when below it).
`details=True` adds the project's lines: model inputs and outputs, each op's variable and shape,
FLOPs, the call site's code and the op's own line, and per module its call count, the ops that
ran it eagerly and why it was skipped.

A pure function of the records of `dataflow`: depends on dataflow only.
"""

from __future__ import annotations

from .dataflow import DataFlow, ModuleInfo, OpInfo

import os

__all__ = ["format_summary", "LEGEND", "DETAILS_LEGEND", "display_path"]

LEGEND = """\
Legend:
  ■ module_name (module_type)  ◆ op_name [op_type]

  op inputs:  {I: producer[N]}  —  I = op_input_spec index; N = output slot of the producing op
  op states:     param_name    —  model parameter or buffer
  op outputs: {N: [consumers]} —  N = output slot index; consumers = ops receiving that output
  untracked_N                  —  input tensor whose producer was not intercepted (e.g. raw attribute or global tensor); still quantizable via op_input_spec
  module inputs:  {I: [op[N], ...]}  —  I = module_input_spec index; op[N] = op and its input slot receiving data from outside; absent keys = non-quantizable
  module outputs: {I: op[N]}         —  I = module_output_spec index; op[N] = op and its output slot leaving the module; absent keys = non-quantizable"""

DETAILS_LEGEND = """\
  variable:   name -> shapes       —  the source variable the op binds and its output reprs
  flops / code / op source         —  the op's FLOPs, the call site's source text, the op's own line
  input_<i> / output_<i>           —  model input i / model output i"""

_RESET = "\x1b[0m"
_STYLES = {"module": "\x1b[1;34m", "type": "\x1b[33m", "op": "\x1b[1;36m", "optype": "\x1b[35m", "dim": "\x1b[2m",
           "label": "\x1b[2m", "warn": "\x1b[31m"}


class _Painter:
    def __init__(self, colorize: bool) -> None:
        self.colorize = colorize

    def __call__(self, style: str, text: str) -> str:
        if not self.colorize or not text:
            return text
        return f"{_STYLES[style]}{text}{_RESET}"


def _dict_text(mapping: dict[int, tuple[str, ...]], single: bool) -> str:
    parts = []
    for key, values in mapping.items():
        if single and len(values) == 1:
            parts.append(f"{key}: {values[0]}")
        else:
            parts.append(f"{key}: [{', '.join(values)}]")
    return "{" + ", ".join(parts) + "}"


def _relative(name: str, module: str) -> str:
    return name[len(module) + 1:] if module and name.startswith(module + ".") else name


def display_path(filename: str) -> str:
    """`filename` relative to the working directory when it lies below it, else as it is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if relative.startswith(os.pardir) else relative


def _op_lines(op: OpInfo, paint: _Painter, details: bool) -> list[str]:
    lines = [f"{paint('op', '◆ ' + op.op_name)} {paint('optype', '[' + op.op_type + ']')}"
             + (paint("dim", "  (module run eagerly)") if op.kind == "module" else "")]
    activations = {i: edge.label() for i, edge in enumerate(op.inputs) if not edge.is_state}
    lines.append(f"  {paint('label', 'op inputs: ')} " + "{" + ", ".join(f"{k}: {v}" for k, v in activations.items()) + "}")
    if op.states:
        lines.append(f"  {paint('label', 'op states: ')} " + ", ".join(_relative(s, op.module_name) for s in op.states))
    outs = {slot: consumers for slot, consumers in enumerate(op.outputs)}
    lines.append(f"  {paint('label', 'op outputs:')} " + "{" + ", ".join(
        f"{k}: [{', '.join(v)}]" for k, v in outs.items()) + "}")
    site = op.call_site
    if site is not None:
        lines.append(f"  {paint('label', 'filepath:')}  {paint('dim', f'{display_path(site.filename)}:{site.lineno}')}")
    if not details:
        return lines
    shapes = ", ".join(r.describe() for r in op.output_reprs) or "(no tensor)"
    lines.append(f"  {paint('label', 'variable:  ')} {op.var_name or '(none)'} -> {shapes}")
    if op.flops:
        lines.append(f"  {paint('label', 'flops:     ')} {op.flops:,}")
    if site is not None and site.code:
        lines.append(f"  {paint('label', 'code:      ')} {paint('dim', site.code.strip())}")
    if op.location is not None and op.location != site:
        lines.append(f"  {paint('label', 'op source: ')} {paint('dim', str(op.location))}")
        if op.location.code:
            lines.append(f"  {paint('label', 'op code:   ')} {paint('dim', op.location.code.strip())}")
    return lines


def _module_lines(info: ModuleInfo, paint: _Painter, root: bool, details: bool) -> list[str]:
    if root:
        head = paint("type", f"({info.module_type})")
    else:
        head = f"{paint('module', '■ ' + info.module_name)} {paint('type', '(' + info.module_type + ')')}"
    lines = [head]
    if info.inputs:
        lines.append(f"    {paint('label', 'module inputs: ')} {_dict_text(info.inputs, single=False)}")
    if info.outputs:
        lines.append(f"    {paint('label', 'module outputs:')} {_dict_text(info.outputs, single=True)}")
    if not details:
        return lines
    if info.calls != 1:
        lines.append(f"    {paint('label', 'calls:         ')} {info.calls}"
                     + (" (not called on these inputs)" if info.calls == 0 else ""))
    if info.run_by:
        lines.append(f"    {paint('label', 'run inside:    ')} {', '.join(dict.fromkeys(info.run_by))}")
    if info.skipped:
        lines.append(f"    {paint('label', 'skipped:       ')} {paint('warn', info.skipped)}")
    return lines


def format_summary(flow: DataFlow, colorize: bool = True, details: bool = False) -> str:
    """The legend, then the module tree with its ops, as one string; `details` adds the project's lines."""
    paint = _Painter(colorize)
    ops = {op.op_name: op for op in flow.ops}
    first = {op.op_name: op.index for op in flow.ops}
    modules = flow.modules
    out = [LEGEND] + ([DETAILS_LEGEND] if details else []) + [""]
    for port in (flow.inputs if details else ()):
        out.append(f"{paint('label', 'model input:')} {port.name} = {port.var_name} {port.repr.describe()}")
    for port in (flow.outputs if details else ()):
        source = port.source.label() if port.source is not None else "?"
        out.append(f"{paint('label', 'model output:')} {port.name} = {source} {port.repr.describe()}")
    if details and (flow.inputs or flow.outputs):
        out.append("")

    def emit(path: str, prefix: str) -> None:
        info = modules[path]
        items = [(2 * first[name] + 1, "op", name) for name in info.ops]
        items += [(modules[child].order, "module", child) for child in info.children]
        items.sort(key=lambda item: item[0])
        for position, (_, kind, key) in enumerate(items):
            last = position == len(items) - 1
            branch = "└── " if last else "├── "
            cont = "    " if last else "│   "
            lines = _op_lines(ops[key], paint, details) if kind == "op" else _module_lines(modules[key], paint, False,
                                                                                               details)
            out.append(prefix + branch + lines[0])
            out.extend(prefix + cont + line for line in lines[1:])
            if kind == "module":
                emit(key, prefix + cont)

    if "" in modules:
        root_lines = _module_lines(modules[""], paint, True, details)
        out.extend(root_lines)
        emit("", "")
    if details and flow.unattributed_flops:
        out.append(f"(FLOPs outside any op: {flow.unattributed_flops:,})")
    return "\n".join(out) + "\n"
