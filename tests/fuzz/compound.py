"""Compound statements of the forward grammar: if/elif/else, for, while, try, with, def and lambda.

Loops are bounded by construction (range of a literal, a while counter incremented first, containers
that the body never resizes); closures read the enclosing variables and rebind only their own (or a
`nonlocal` counter). A mixin of `StatementGrammar`, which provides `body`, `nested` and `emit`.

Depends on `grammar` and `choices` only.
"""

from __future__ import annotations

from .grammar import ExpressionGrammar, Scope

__all__ = ["CompoundGrammar"]

_HANDLERS = ["RuntimeError", "(IndexError, KeyError)", "ValueError", "ZeroDivisionError", "Exception",
             "TypeError", "(NameError, AttributeError)", "ArithmeticError", "LookupError", ""]


class CompoundGrammar(ExpressionGrammar):
    """Statements with bodies; the bodies are written by `StatementGrammar.body`."""

    def function_def(self, s: Scope, indent: int, depth: int) -> None:
        choice = self.c.integer(0, 5)
        name = self.fresh("f")
        if choice == 4:
            # closures made in a comprehension: late binding reads the last value, a default the current
            i = self.fresh("i")
            t = self.fresh("t")
            late = self.c.chance(50)
            params = f"{t}" if late else f"{t}, {i}={i}"
            self.emit(indent, f"{name}s = [lambda {params}: {t} * {i} for {i} in range({self.c.integer(1, 3)})]")
            self.emit(indent, f"{name} = {name}s[{self.c.choice(['0', '-1'])}]")
            s.bind(name, "func")
            return
        if choice == 5:
            t = self.fresh("t")
            self.emit(indent, f"def {name}({t}, *, k={self.number(s, 0)}, **kw):")
            inner = self.closure_scope(s, {t: "tensor", "kw": "opts"})
            self.body(inner, indent + 1, self.c.integer(1, 2), max(depth - 1, 0))
            self.emit(indent + 1, f"return {self.tensor(inner, 1)} * k")
            s.bind(name, "func")
            return
        if choice == 3 and self.c.chance(40):
            t = self.fresh("t")
            self.emit(indent, self.c.choice([
                f"def {name}({t}, acc=[]):\n{'    ' * (indent + 1)}acc.append(1)\n"
                f"{'    ' * (indent + 1)}return {t} * len(acc)",
                f"{name} = lambda *ts, **kw: sum(ts, kw.get('start', {self.tensor(s, 0)}))",
                f"def {name}({t}, layer=self.lin):\n{'    ' * (indent + 1)}return layer({t})" if s.has_self
                else f"{name} = lambda {t}: {t}",
            ]))
            s.bind(name, "func")
            return
        if choice == 0:
            t = self.fresh("t")
            inner = self.closure_scope(s, {t: "tensor"})
            default = self.c.choice(["", ", k=2.0", f", k={self.integer(s, 1)}"])
            if default:
                inner.bind("k", "int")
                inner.readonly.add("k")
            self.emit(indent, f"{name} = lambda {t}{default}: {self.tensor(inner, 2)}")
            s.bind(name, "func")
        elif choice == 1 and s.writable("int"):
            counter = self.c.choice(s.writable("int"))
            self.emit(indent, f"def {name}():")
            self.emit(indent + 1, f"nonlocal {counter}")
            self.emit(indent + 1, f"{counter} = {counter} + {self.c.integer(1, 2)}")
            self.emit(indent + 1, f"return {counter}")
            s.bind(name, "counter")
        else:
            t = self.fresh("t")
            extra = self.c.choice(["", ", *more", ", scale=1.5", ", **kw"])
            self.emit(indent, f"def {name}({t}{extra}):")
            inner = self.closure_scope(s, {t: "tensor"})
            if extra == ", *more":
                inner.bind("more", "seq")
            elif extra == ", **kw":
                inner.bind("kw", "opts")
            self.body(inner, indent + 1, self.c.integer(1, 3), max(depth - 1, 0))
            result = self.tensor(inner, 2)
            if extra == ", scale=1.5":
                result = f"{result} * scale"
            self.emit(indent + 1, f"return {result}")
            s.bind(name, "func")

    def closure_scope(self, s: Scope, params: dict[str, str]) -> Scope:
        inner = s.copy()
        inner.owner = "closure"
        inner.loop = False
        inner.handler = None
        inner.readonly |= {n for kind in inner.vars.values() for n in kind}
        inner.maybe = []
        for name, kind in params.items():
            inner.bind(name, kind)
            inner.readonly.discard(name)
        return inner

    # -- compound statements ----------------------------------------------------------------------

    def if_statement(self, s: Scope, indent: int, depth: int) -> None:
        if self.c.chance(15):
            name = self.fresh("h")
            self.emit(indent, f"if ({name} := {self.tensor(s, 1)}).sum() > 0:")
            s.bind(name, "tensor")
        else:
            self.emit(indent, f"if {self.boolean(s, 2)}:")
        branches = [self.nested(s, indent + 1, depth - 1)]
        for _ in range(self.c.integer(0, 2)):
            self.emit(indent, f"elif {self.boolean(s, 1)}:")
            branches.append(self.nested(s, indent + 1, depth - 1))
        if self.c.chance(60):
            self.emit(indent, "else:")
            branches.append(self.nested(s, indent + 1, depth - 1))
        for branch in branches:
            s.absorb(branch)

    def for_statement(self, s: Scope, indent: int, depth: int) -> None:
        inner = s.copy()
        inner.loop = True
        choice = self.c.integer(0, 10)
        i, u = self.fresh("i"), self.fresh("u")
        lst = self.pick(s, "list")
        if choice == 1 and lst:
            self.emit(indent, f"for {i}, {u} in enumerate({lst}):")
            inner.bind(i, "int"), inner.bind(u, "tensor"), inner.frozen.add(lst)
        elif choice == 2 and lst:
            self.emit(indent, f"for {u} in {lst}:")
            inner.bind(u, "tensor"), inner.frozen.add(lst)
        elif choice == 3 and s.names("dict"):
            name = self.pick(s, "dict")
            self.emit(indent, f"for {i}, {u} in {name}.items():")
            inner.bind(i, "str"), inner.bind(u, "tensor"), inner.frozen.add(name)
        elif choice == 4 and lst:
            self.emit(indent, f"for {u}, {i} in zip({lst}, {self.pick(s, 'list')}):")
            inner.bind(u, "tensor"), inner.bind(i, "tensor"), inner.frozen.update(s.names("list"))
        elif choice == 5 and s.has_containers:
            container = self.c.choice(["self.layers", "self.seq", "self.blocks.values()", "self.layers[:2]",
                                       "self.layers[::-1]"])
            self.emit(indent, f"for {u} in {container}:")
            inner.bind(u, "module")
            target = self.tensor_target(inner, indent + 1)
            self.emit(indent + 1, f"{target} = {u}({target})")
        elif choice == 6 and s.has_containers:
            self.emit(indent, f"for {i} in self.blocks:")
            inner.bind(i, "str")
            target = self.tensor_target(inner, indent + 1)
            self.emit(indent + 1, f"{target} = self.blocks[{i}]({target})")
        elif choice == 7 and s.names("seq"):
            self.emit(indent, f"for {u} in {self.pick(s, 'seq')}:")
            inner.bind(u, "tensor")
        elif choice == 8:
            # iterating a tensor yields its rows; keep them (2, 4) so the body may use them as tensors
            self.emit(indent, f"for {u} in {self.tensor(s, 1)}.unsqueeze(1).expand(2, 2, 4):")
            inner.bind(u, "tensor")
        elif choice == 9 and lst:
            self.emit(indent, self.c.choice([
                f"for {i}, ({u}, *_) in enumerate(zip({lst}, {lst}), start=1):",
                f"for {i}, {u} in sorted(enumerate({lst}), key=lambda p: -p[0]):",
                f"for {u}, {i} in zip({lst}, range(3), strict=True):",
            ]))
            inner.bind(i, "int"), inner.bind(u, "tensor"), inner.frozen.add(lst)
        else:
            stop = self.c.integer(0, 4)
            ranges = [f"range({stop})", f"reversed(range({stop}))", f"range(1, {stop}, 2)"]
            self.emit(indent, f"for {i} in {self.c.choice(ranges)}:")
            inner.bind(i, "int")
        self.body(inner, indent + 1, self.c.integer(1, 3), depth - 1)
        inner.loop = s.loop
        inner.frozen = set(s.frozen)
        s.absorb(inner)
        if self.c.chance(30):
            self.emit(indent, "else:")
            s.absorb(self.nested(s, indent + 1, depth - 1))

    def while_statement(self, s: Scope, indent: int, depth: int) -> None:
        w = self.fresh("w")
        stop = self.c.integer(0, 4)
        self.emit(indent, f"{w} = 0")
        inner = s.copy()
        inner.loop = True
        inner.bind(w, "int")
        inner.readonly.add(w)
        if self.c.chance(50):
            self.emit(indent, f"while {w} < {stop}:")
            self.emit(indent + 1, f"{w} += 1")
        else:
            self.emit(indent, "while True:")
            self.emit(indent + 1, f"{w} += 1")
            self.emit(indent + 1, f"if {w} > {stop}:")
            self.emit(indent + 2, "break")
        self.body(inner, indent + 1, self.c.integer(1, 3), depth - 1)
        inner.loop = s.loop
        s.absorb(inner)
        s.bind(w, "int")
        if self.c.chance(30):
            self.emit(indent, "else:")
            s.absorb(self.nested(s, indent + 1, depth - 1))

    def try_statement(self, s: Scope, indent: int, depth: int) -> None:
        self.emit(indent, "try:")
        inner = s.copy()
        start = len(self.lines)
        if self.c.chance(60):
            self.body(inner, indent + 1, self.c.integer(0, 2), depth - 1)
            self.raising_statement(inner, indent + 1)
            self.body(inner, indent + 1, self.c.integer(0, 1), depth - 1)
        else:
            self.body(inner, indent + 1, self.c.integer(1, 3), depth - 1)
        assert len(self.lines) > start
        scopes = [inner]
        handlers = [self.c.choice(_HANDLERS) for _ in range(self.c.integer(0 if self.c.chance(20) else 1, 3))]
        if "" in handlers:  # a bare `except:` must come last
            handlers = [h for h in handlers if h] + [""]
        for handler in handlers:
            if handler and self.c.chance(60):
                name = self.fresh("e")
                self.emit(indent, f"except {handler} as {name}:")
                scopes.append(self.nested(s, indent + 1, depth - 1, handler=name))
            else:
                self.emit(indent, f"except {handler}:" if handler else "except:")
                scopes.append(self.nested(s, indent + 1, depth - 1))
        if handlers and self.c.chance(30):
            self.emit(indent, "else:")
            scopes.append(self.nested(s, indent + 1, depth - 1))
        if not handlers or self.c.chance(30):
            self.emit(indent, "finally:")
            scopes.append(self.nested(s, indent + 1, depth - 1))
        for scope in scopes:
            s.absorb(scope)

    def with_statement(self, s: Scope, indent: int, depth: int) -> None:
        context = self.c.choice(["torch.no_grad()", "torch.enable_grad()", "torch.autocast('cpu', enabled=False)"])
        if self.c.chance(20):
            context += f" as {self.fresh('g')}"
        if s.has_self and self.c.chance(30):
            self.emit(indent, f"with {context}:")
            self.emit(indent + 1, f"self.weight.mul_({self.c.choice(['0.5', '1.0'])})")
            s.absorb(self.nested(s, indent + 1, depth - 1))
            return
        self.emit(indent, f"with {context}:")
        s.absorb(self.nested(s, indent + 1, depth - 1))
