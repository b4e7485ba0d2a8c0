"""Operands compiled once: a getter per operand and a builder of each call's arguments.

`operand_spec` classifies an operand as a constant, a frame variable or a computed value (slices,
displays); `getter` turns that into `getter(frame)`; `args_builder` precomputes a call's positional
and keyword layout so that the common case (all plain variables) is a list of names. `call_piece`
goes one step further: it writes the call as Python source once per layout (`f[out] = t(f[x], c1,
dim=f[d])`) over names whose values it keeps in the piece's `env`; `operator_piece` writes a call
of an operator as the operator (`a + b`, `x.view` for a constant getattr). `piece_closure` compiles
a piece alone (`call_closure` both at once); `bodies.fuse_body` splices many into one function,
keeping them apart with `renamed`. One factory is compiled per distinct source text, so identical
layers share their code. `fusable_method_call` tells the compiler when `$t = getattr(obj, 'm')` +
`$t(...)` can run as one piece; `names_read` lists the frame variables an instruction reads itself
(not its nested bodies).

Depends on the schema and `observer` (for the generated code's file name).
"""

from __future__ import annotations

import io
import keyword
import operator
import tokenize
from operator import itemgetter
from typing import Any, Callable, Optional
from ..schema.model import Const, Instruction, OpInstruction, SliceOf, VarRef
from .observer import GENERATED_FILE

__all__ = ['operand_spec', 'getter', 'args_builder', 'call_closure', 'Piece', 'call_piece', 'piece_closure', 'renamed', 'operand_text', 'merge_kwargs', 'function_str',
           'fusable_method_call', 'mentions', 'names_read']


def operand_spec(op: Any) -> tuple[str, Any]:
    """('const', value) | ('var', name) | ('fn', getter(frame))."""
    if isinstance(op, VarRef):
        return "var", op.name
    if isinstance(op, Const):
        return "const", op.value
    if isinstance(op, SliceOf):
        parts = [operand_spec(p) for p in (op.lower, op.upper, op.step)]
        if all(k == "const" for k, _ in parts):
            return "const", slice(*(v for _, v in parts))
        getters = [getter(k, v) for k, v in parts]
        lo, hi, st = getters
        return "fn", lambda f: slice(lo(f), hi(f), st(f))
    if isinstance(op, tuple):
        parts = [operand_spec(p) for p in op]
        if all(k == "const" for k, _ in parts):
            return "const", tuple(v for _, v in parts)
        if all(k == "var" for k, _ in parts) and len(parts) > 1:
            get = itemgetter(*(v for _, v in parts))
            return "fn", get
        getters = [getter(k, v) for k, v in parts]
        return "fn", lambda f: tuple([g(f) for g in getters])
    if isinstance(op, list):
        getters = [getter(*operand_spec(p)) for p in op]
        return "fn", lambda f: [g(f) for g in getters]
    if isinstance(op, dict):
        items = [(getter(*operand_spec(k)), getter(*operand_spec(v))) for k, v in op.items()]
        return "fn", lambda f: {k(f): v(f) for k, v in items}
    return "const", op


def getter(kind: str, value: Any) -> Callable[[dict], Any]:
    if kind == "const":
        return lambda f: value
    if kind == "var":
        return itemgetter(value)
    return value


def args_builder(args: list, kwargs: dict, star_args: tuple, args_var: Optional[str],
                  kwargs_var: Optional[str]) -> tuple[Optional[tuple], Callable[[dict], tuple[list, dict]]]:
    """Returns (simple_var_names or None, build(frame) -> (args, kwargs))."""
    compiled = [operand_spec(a) for a in args]
    kw_compiled = {k: operand_spec(v) for k, v in kwargs.items()}
    simple = (not kwargs and not star_args and args_var is None and kwargs_var is None
              and all(k == "var" for k, _ in compiled))
    template = [v if k == "const" else None for k, v in compiled]
    var_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "var"]
    fn_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "fn"]
    kw_template = {k: v for k, (kind, v) in kw_compiled.items() if kind == "const"}
    kw_vars = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "var"]
    kw_fns = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "fn"]
    stars = frozenset(star_args)

    def build(f: dict) -> tuple[list, dict]:
        a = template.copy()
        for i, name in var_slots:
            a[i] = f[name]
        for i, g in fn_slots:
            a[i] = g(f)
        if stars:
            flat = []
            for i, item in enumerate(a):
                if i in stars:
                    flat.extend(item)
                else:
                    flat.append(item)
            a = flat
        if args_var is not None:
            a.extend(f[args_var])
        kw = kw_template.copy() if kw_template else {}
        for k, name in kw_vars:
            kw[k] = f[name]
        for k, g in kw_fns:
            kw[k] = g(f)
        if kwargs_var is not None:
            extra = f[kwargs_var]
            for k in extra:
                if k in kw:
                    raise TypeError(f"got multiple values for keyword argument '{k}'")
            kw.update(extra)
        return a, kw

    return (tuple(v for _, v in compiled) if simple else None), build


def _collect(**kwargs: Any) -> dict:
    return kwargs


def function_str(x: Any) -> str:
    """How CPython names a callee in a call's TypeError (`_PyObject_FunctionStr`): `mod.qualname()`."""
    try:
        qualname = x.__qualname__
    except AttributeError:
        return str(x)
    module = getattr(x, "__module__", None)
    return f"{module}.{qualname}()" if module is not None and module != "builtins" else f"{qualname}()"


def merge_kwargs(kw: dict, extra: Any, callee: Callable[[], Any]) -> dict:
    """The keywords of `callee()(**kw, **extra)`, merged by CPython itself.

    A keyword given twice, a non-mapping after `**` or a key that is not a string raises the
    TypeError CPython raises for that call, worded with the callee's name as CPython words it.
    """
    try:
        return _collect(**kw, **extra)
    except TypeError as exc:
        text = str(exc)
        own = function_str(_collect)
        if not text.startswith(own):
            raise
        raise TypeError(function_str(callee()) + text[len(own):]) from None


_FACTORIES: dict[str, Callable] = {}


def operand_text(op: Any, slot: str, env: dict) -> str:
    """Source reading operand `op` from the frame `f`; what it needs is put into `env` under `slot`."""
    kind, value = operand_spec(op)
    env[slot] = value
    if kind == "var":
        return f"f[{slot}]"
    if kind == "fn":
        return f"{slot}(f)"
    return slot


class Piece:
    """One instruction as generated source: `text` (statements reading and writing the frame `f`)
    over the names of `env`. `piece_closure` compiles it alone; `fuse_body` splices several into one
    straight-line function. `_i` (the instruction) and `_r` (a fused method call's getattr) are kept
    in `env` for error reports, never read by `text`."""

    __slots__ = ("text", "env")

    def __init__(self, text: str, env: dict):
        self.text = text
        self.env = env


def call_piece(statement: str, env: dict, args: list, kwargs: dict, star_args: tuple, args_var: Optional[str],
               kwargs_var: Optional[str], callee: str) -> Piece:
    """`statement` with its `{call}` and `{lists}` replaced by the call's arguments, as a `Piece`.

    `{call}` becomes `f[a], c1, *f[s], dim=f[d]` (a call's own arguments) and `{lists}` becomes
    `[f[a], c1, *f[s]], {'dim': f[d]}` (what an invoker or `call_value` takes), with the evaluation
    order, spreading and keyword checks of `args_builder`'s `build`. `env` holds the other names the
    statement uses; `callee` is source naming what is called, read only when `**kwargs` cannot be
    merged (see `merge_kwargs`).
    """
    env = dict(env)
    # Keyword names are the only part of an instruction written into the generated source: a plain
    # str only (an identifier as is, anything else as its repr), so no file can put code there.
    for key in kwargs:
        if type(key) is not str:
            raise TypeError(f"keywords must be strings, not {type(key).__name__}")
    stars = set(star_args)
    positional = [("*" if i in stars else "") + operand_text(op, f"p{i}", env) for i, op in enumerate(args)]
    if args_var is not None:
        env["av"] = args_var
        positional.append("*f[av]")
    pairs = [(key, operand_text(op, f"k{j}", env)) for j, (key, op) in enumerate(kwargs.items())]
    plain_keys = all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k, _ in pairs)
    display = "{" + ", ".join(f"{k!r}: {text}" for k, text in pairs) + "}"
    if kwargs_var is not None:
        env["kv"] = kwargs_var
        env["merge_kwargs"] = merge_kwargs
        merged = f"merge_kwargs({display}, f[kv], lambda: {callee})"
    else:
        merged = display
    lists = f"[{', '.join(positional)}], {merged}"
    # A call's own keywords: written out (or spread from the display when a key is no identifier),
    # then `**f[kv]`, so that CPython itself merges them and words any error.
    own = [f"{k}={text}" for k, text in pairs] if plain_keys else ["**" + display] if pairs else []
    call = ", ".join([*positional, *own, *(["**f[kv]"] if kwargs_var is not None else [])])
    return Piece(statement.replace("{call}", call).replace("{lists}", lists), env)


# Calls of these callables are written as the operator itself (`operator.add(a, b)` is `a + b`:
# the same C slot, the same errors) so that the generated code pays no call for them.
_OPERATORS = {operator.add: "{0} + {1}", operator.sub: "{0} - {1}", operator.mul: "{0} * {1}",
              operator.truediv: "{0} / {1}", operator.floordiv: "{0} // {1}", operator.mod: "{0} % {1}",
              operator.pow: "{0} ** {1}", operator.matmul: "{0} @ {1}", operator.and_: "{0} & {1}",
              operator.or_: "{0} | {1}", operator.xor: "{0} ^ {1}", operator.lshift: "{0} << {1}",
              operator.rshift: "{0} >> {1}", operator.getitem: "{0}[{1}]", operator.neg: "-{0}",
              operator.pos: "+{0}", operator.invert: "~{0}", operator.not_: "not {0}", operator.is_: "{0} is {1}",
              operator.is_not: "{0} is not {1}", operator.eq: "{0} == {1}", operator.ne: "{0} != {1}",
              operator.lt: "{0} < {1}", operator.le: "{0} <= {1}", operator.gt: "{0} > {1}", operator.ge: "{0} >= {1}"}


def attribute_name(op: Any) -> Optional[str]:
    """The attribute `op` names when it is a constant identifier (`getattr(x, 'weight')` is `x.weight`)."""
    kind, value = operand_spec(op)
    if kind == "const" and type(value) is str and value.isidentifier() and not keyword.iskeyword(value) \
            and not value.startswith("__"):
        return value
    return None


def operator_piece(out: str, target: Any, args: list, env: dict) -> Optional[Piece]:
    """`f[out] = a + b` (or `x.name` for a constant getattr) for a call of an operator, else None."""
    try:
        template = _OPERATORS.get(target)
    except TypeError:  # an unhashable callable
        return None
    if template is None and target is getattr and len(args) == 2 and attribute_name(args[1]) is not None:
        env = dict(env, out=out)
        return Piece(f"f[out] = {operand_text(args[0], 'p0', env)}.{attribute_name(args[1])}", env)
    if template is None or len(args) != template.count("{"):
        return None
    env = dict(env, out=out)
    texts = [operand_text(op, f"p{i}", env) for i, op in enumerate(args)]
    return Piece("f[out] = " + template.format(*texts), env)


def piece_closure(name: str, piece: Piece) -> Callable[[dict], Any]:
    """The closure `name(f)` running `piece` (`_i` and `_r` are default arguments so that error
    reports find them in the frame's locals, as in every closure of the engine). One factory is
    compiled per distinct source text, so a model with thousands of calls compiles a few dozen."""
    env = piece.env
    body = piece.text.replace("\n", "\n        ")
    defaults = ", ".join(f"{n}={n}" for n in ("_i", "_r") if n in env)
    source = (f"def factory({', '.join(env)}):\n"
              f"    def {name}(f{', ' if defaults else ''}{defaults}):\n"
              f"        {body}\n"
              f"    return {name}\n")
    return _factory(source)(**env)


def _factory(source: str) -> Callable:
    factory = _FACTORIES.get(source)
    if factory is None:
        namespace: dict = {}
        exec(compile(source, GENERATED_FILE, "exec"), namespace)
        factory = _FACTORIES[source] = namespace["factory"]
    return factory


def call_closure(name: str, statement: str, env: dict, args: list, kwargs: dict, star_args: tuple,
                 args_var: Optional[str], kwargs_var: Optional[str], callee: str) -> Callable[[dict], Any]:
    """The closure `name(f)` running `statement` with the call's arguments (see `call_piece`)."""
    return piece_closure(name, call_piece(statement, env, args, kwargs, star_args, args_var, kwargs_var, callee))


_RENAMED: dict = {}


def renamed(text: str, names: frozenset, suffix: str) -> str:
    """`text` with each name of `names` it uses as a variable (not an attribute, not a keyword of a
    call) spelled `name + suffix`: the pieces spliced into one function keep their names apart."""
    key = (text, names, suffix)
    out = _RENAMED.get(key)
    if out is not None:
        return out
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    pieces = []
    for index, tok in enumerate(tokens):
        value = tok.string
        if tok.type == tokenize.NAME and value in names:
            before = tokens[index - 1].string if index else ""
            after = tokens[index + 1].string if index + 1 < len(tokens) else ""
            if before != "." and after != "=":
                value = value + suffix
        pieces.append((tok.type, value))
    out = tokenize.untokenize(pieces)
    _RENAMED[key] = out
    return out


def fusable_method_call(first: Instruction, second: Instruction) -> bool:
    return (type(first) is OpInstruction and first.target is getattr and len(first.args) == 2
            and isinstance(first.args[1], str) and not first.kwargs and not first.star_args
            and first.out_var.startswith("$") and type(second) is OpInstruction
            and isinstance(second.target, VarRef) and second.target.name == first.out_var
            and not mentions(second, first.out_var))


def mentions(instr: OpInstruction, name: str) -> bool:
    def walk(op: Any) -> bool:
        if isinstance(op, VarRef):
            return op.name == name
        if isinstance(op, (list, tuple)):
            return any(walk(o) for o in op)
        if isinstance(op, dict):
            return any(walk(k) or walk(v) for k, v in op.items())
        if isinstance(op, SliceOf):
            return walk(op.lower) or walk(op.upper) or walk(op.step)
        return False

    return walk(instr.args) or walk(instr.kwargs) or name in (instr.args_var, instr.kwargs_var)


_READ_FIELDS = ("target", "args", "kwargs", "defaults", "kw_defaults", "exc", "cause")
_READ_NAMES = ("args_var", "kwargs_var", "callee_var", "context_var", "cond_var")


def names_read(instr: Instruction) -> list[str]:
    """The frame variables `instr` itself reads (operands, `*args`/`**kwargs` names, returned names);
    the instructions of nested bodies and conditions are not included: they are compiled on their own."""
    found: list[str] = []

    def walk(op: Any) -> None:
        if isinstance(op, VarRef):
            found.append(op.name)
        elif isinstance(op, (list, tuple)):
            for o in op:
                walk(o)
        elif isinstance(op, dict):
            for k, v in op.items():
                walk(k)
                walk(v)
        elif isinstance(op, SliceOf):
            walk(op.lower)
            walk(op.upper)
            walk(op.step)

    for name in _READ_FIELDS:
        walk(getattr(instr, name, None))
    for name in _READ_NAMES:
        value = getattr(instr, name, None)
        if isinstance(value, str) and value:
            found.append(value)
    found.extend(getattr(instr, "out_vars", ()) or ())
    return found
