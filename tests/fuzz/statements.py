"""The statement half of the forward grammar: simple statements, bodies and what a body returns.

`StatementGrammar.body` writes the statements of a forward, helper, child or closure; compound
statements (if/for/while/try/with, def and lambda) come from `CompoundGrammar`. A variable first
bound in a nested body is only "maybe bound" after it, so reading it is one of the deliberate ways
a program may raise.

Depends on `compound`, `grammar` and `choices` only.
"""

from __future__ import annotations

from typing import Callable

from .compound import CompoundGrammar
from .grammar import NAME_REBINDS, Scope

__all__ = ["StatementGrammar"]

class StatementGrammar(CompoundGrammar):
    """Writes indented statements into `self.lines`."""

    def __init__(self, chooser, *, unsupported: bool = False):
        super().__init__(chooser)
        self.lines: list[str] = []
        self.unsupported = unsupported

    def emit(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def body(self, s: Scope, indent: int, count: int, depth: int) -> None:
        start = len(self.lines)
        for _ in range(count):
            self.statement(s, indent, depth)
        if len(self.lines) == start:
            self.emit(indent, "pass")

    def nested(self, s: Scope, indent: int, depth: int, **changes) -> Scope:
        inner = s.copy()
        for key, value in changes.items():
            setattr(inner, key, value)
        self.body(inner, indent, self.c.integer(1, 3), depth)
        return inner

    # -- one statement ----------------------------------------------------------------------------

    def statement(self, s: Scope, indent: int, depth: int) -> None:
        table: list[tuple[int, Callable[[], None]]] = [
            (20, lambda: self.assign_tensor(s, indent)),
            (5, lambda: self.assign_other(s, indent)),
            (5, lambda: self.augassign(s, indent)),
            (5, lambda: self.inplace(s, indent)),
            (4, lambda: self.subscript_store(s, indent)),
            (5, lambda: self.container_op(s, indent)),
            (4, lambda: self.unpack(s, indent)),
            (3, lambda: self.function_def(s, indent, depth)),
            (1, lambda: self.assert_or_raise(s, indent)),
            (1, lambda: self.delete(s, indent)),
            (2, lambda: self.expression_statement(s, indent)),
            (1, lambda: self.raising_statement(s, indent)),
        ]
        if depth > 0:
            table += [
                (8, lambda: self.if_statement(s, indent, depth)),
                (7, lambda: self.for_statement(s, indent, depth)),
                (3, lambda: self.while_statement(s, indent, depth)),
                (6, lambda: self.try_statement(s, indent, depth)),
                (2, lambda: self.with_statement(s, indent, depth)),
            ]
        if s.loop:
            table.append((3, lambda: self.loop_jump(s, indent)))
        if s.has_self:
            table.append((2, lambda: self.state_mutation(s, indent)))
        if indent > 2:
            table.append((1, lambda: self.early_return(s, indent)))
        if s.handler is not None:
            table.append((2, lambda: self.handler_statement(s, indent)))
        if self.unsupported and s.owner == "forward":
            table.append((2, lambda: self.unsupported_statement(s, indent)))
        if self.names:
            table.append((14, lambda: self.rebind_name(s, indent)))
        self.c.weighted(table)()

    def rebind_name(self, s: Scope, indent: int) -> None:
        """The "names" family: rebind a module name mid-forward, now and then on a data-dependent
        branch (so the parse's path and a run's path may differ), through a helper or directly."""
        text = self.c.choice(NAME_REBINDS).format(number=self.c.choice(["0.5", "-1.5", "3.0", "2"]),
                                                  act=repr(self.c.choice(["relu", "tanh", "gelu", "sigmoid"])))
        if self.c.chance(50):
            self.emit(indent, f"if {self.boolean(s, 1)}:")
            self.emit(indent + 1, text)
        else:
            self.emit(indent, text)

    def assign_tensor(self, s: Scope, indent: int) -> None:
        targets = s.writable("tensor")
        if targets and self.c.chance(50):
            name = self.c.choice(targets)
        else:
            name = self.fresh("h")
        value = self.tensor(s, self.c.integer(1, 3))
        if self.c.chance(8):
            other = self.fresh("h")
            self.emit(indent, f"{name} = {other} = {value}")
            s.bind(other, "tensor")
        elif self.c.chance(5):
            self.emit(indent, f"{name}: torch.Tensor = {value}")
        else:
            self.emit(indent, f"{name} = {value}")
        s.bind(name, "tensor")

    def tensor_target(self, s: Scope, indent: int) -> str:
        """A tensor variable this body may rebind (binding a fresh one first when there is none)."""
        targets = s.writable("tensor")
        if targets:
            return self.c.choice(targets)
        name = self.fresh("h")
        self.emit(indent, f"{name} = {self.tensor(s, 1)}")
        s.bind(name, "tensor")
        return name

    def assign_other(self, s: Scope, indent: int) -> None:
        kind = self.c.choice(["int", "int", "str", "bool", "set"])
        targets = s.writable(kind)
        name = self.c.choice(targets) if targets and self.c.chance(40) else self.fresh(kind[0] + "v")
        if kind == "int":
            value = self.integer(s, 2)
        elif kind == "str":
            value = self.string(s, 2)
        elif kind == "bool":
            value = self.boolean(s, 1)
        else:
            j = self.fresh("j")
            value = self.c.choice([
                lambda: f"{{{self.integer(s, 1)}, {self.integer(s, 1)}, 3}}",
                lambda: f"{{{j} % 3 for {j} in range({self.c.integer(0, 5)})}}",
                lambda: f"set(range({self.c.integer(0, 3)})) | {{{self.integer(s, 1)}}}",
            ])()
        self.emit(indent, f"{name} = {value}")
        s.bind(name, kind)

    def augassign(self, s: Scope, indent: int) -> None:
        options = []
        if s.writable("tensor"):
            options.append(lambda: f"{self.c.choice(s.writable('tensor'))} "
                                   f"{self.c.choice(['+=', '-=', '*='])} {self.tensor(s, 1)}")
            options.append(lambda: f"{self.c.choice(s.writable('tensor'))} *= {self.c.choice(['0.5', '2', '-1'])}")
        if s.writable("int"):
            options.append(lambda: f"{self.c.choice(s.writable('int'))} {self.c.choice(['+=', '-=', '*='])} "
                                   f"{self.c.integer(1, 3)}")
        if s.writable("str"):
            options.append(lambda: f"{self.c.choice(s.writable('str'))} += {self.string(s, 1)}")
        lists = [n for n in s.writable("list") if n not in s.frozen]
        if lists:
            options.append(lambda: f"{self.c.choice(lists)} += [{self.tensor(s, 1)}]")
        if not options:
            return self.assign_tensor(s, indent)
        self.emit(indent, self.c.choice(options)())

    def inplace(self, s: Scope, indent: int) -> None:
        name = self.pick(s, "tensor") or "x"
        op = self.c.choice([
            lambda: f"add_({self.tensor(s, 1)})", lambda: "mul_(0.5)", lambda: "clamp_(-2.0, 2.0)",
            lambda: "relu_()", lambda: f"copy_({self.tensor(s, 1)})", lambda: "zero_()", lambda: "fill_(1.0)",
            lambda: f"sub_({self.tensor(s, 1)}, alpha=2)", lambda: f"masked_fill_({self.tensor(s, 1)} > 0, 0.0)",
            lambda: "tanh_()", lambda: f"addcmul_({self.tensor(s, 1)}, {self.tensor(s, 1)}, value=0.5)",
        ])()
        self.emit(indent, f"{name}.{op}")

    def subscript_store(self, s: Scope, indent: int) -> None:
        name = self.pick(s, "tensor") or "x"
        options = [
            lambda: f"{name}[0] = {self.tensor(s, 1)}[1]",
            lambda: f"{name}[:, {self.c.integer(0, 3)}] = {self.c.choice(['0.5', '-2.0'])}",
            lambda: f"{name}[0, {self.c.integer(0, 3)}] += 1.0",
            lambda: f"{name}[{name} > 1] = 0.0",
            lambda: f"{name}[..., 1:3] = {self.tensor(s, 1)}[:, :2]",
            lambda: f"{name}[{self.integer(s, 1)} % 2] *= 2",
        ]
        if s.names("list"):
            options.append(lambda: f"{self.pick(s, 'list')}[{self.c.choice(['0', '-1'])}] = {self.tensor(s, 1)}")
            options.append(lambda: f"{self.pick(s, 'list')}[-1] += {self.tensor(s, 1)}")
        if s.names("dict"):
            key = self.c.choice(["a", "c", "k"])
            dname = self.pick(s, "dict")

            def store() -> str:
                if dname in s.names("dict") and dname not in s.frozen:
                    s.keys.setdefault(dname, [])
                    if key not in s.keys[dname]:
                        s.keys[dname].append(key)
                return f"{dname}[{key!r}] = {self.tensor(s, 1)}"

            options.append(store)
        self.emit(indent, self.c.choice(options)())

    def container_op(self, s: Scope, indent: int) -> None:
        lists = [n for n in s.writable("list") if n not in s.frozen]
        dicts = [n for n in s.writable("dict") if n not in s.frozen]
        kind = self.c.choice(["list", "dict", "seq"])
        if kind == "list":
            if lists and self.c.chance(60):
                name = self.c.choice(lists)
                text = self.c.choice([
                    lambda: f"{name}.append({self.tensor(s, 1)})",
                    lambda: f"{name}.extend([{self.tensor(s, 1)}, {self.tensor(s, 1)}])",
                    lambda: f"{name}.insert(0, {self.tensor(s, 1)})",
                    lambda: f"{name}.reverse()",
                    lambda: f"{name} = {name}[::-1]",
                    lambda: f"{name} = [{self.tensor(self.with_var(s, 'tensor', 'w'), 1)} for w in {name}]",
                    lambda: f"{name} = [{self.tensor(s, 1)}, *{name}]",
                    lambda: f"{name} = {name} + [{self.tensor(s, 1)}]",
                    lambda: f"del {name}[1:]",
                    lambda: f"{name}[1:] = [{self.tensor(s, 1)}]",
                    lambda: f"{name} = [(h_last := {self.tensor(self.with_var(s, 'tensor', 'w'), 1)}) for w in {name}]"
                            f" + [h_last]",
                ])()
                self.emit(indent, text)
                return
            name = self.fresh("ts")
            self.emit(indent, self.c.choice([
                lambda: f"{name} = [{self.tensor(s, 1)}, {self.tensor(s, 1)}]",
                lambda: f"{name} = [{self.tensor(s, 1)}]",
                lambda: f"{name} = list(({self.tensor(s, 1)}, {self.tensor(s, 1)}))",
                lambda: f"{name} = [{self.tensor(s, 1)} for _ in range({self.c.integer(1, 3)})]",
                lambda: f"{name} = [*[{self.tensor(s, 1)}], {self.tensor(s, 1)}]",
            ])())
            s.bind(name, "list")
            return
        if kind == "dict":
            if dicts and self.c.chance(60):
                name = self.c.choice(dicts)
                keys = s.keys.setdefault(name, [])
                choice = self.c.integer(0, 4)
                if choice == 0:
                    self.emit(indent, f"{name}.update(q={self.tensor(s, 1)})")
                    keys.append("q") if "q" not in keys else None
                elif choice == 1:
                    self.emit(indent, f"{name} = {{**{name}, 'z': {self.tensor(s, 1)}}}")
                    keys.append("z") if "z" not in keys else None
                elif choice == 2:
                    self.emit(indent, f"{name} = {{k: v * 2 for k, v in {name}.items()}}")
                elif choice == 3:
                    self.emit(indent, self.c.choice([f"{name}.pop('a', None)", f"del {name}['a']"]))
                    s.keys[name] = [k for k in keys if k != "a"]
                else:
                    self.emit(indent, f"{name}.setdefault('s', {self.tensor(s, 1)})")
                    keys.append("s") if "s" not in keys else None
                return
            name = self.fresh("d")
            self.emit(indent, self.c.choice([
                lambda: f"{name} = {{'a': {self.tensor(s, 1)}, 'b': {self.tensor(s, 1)}}}",
                lambda: f"{name} = dict(a={self.tensor(s, 1)}, b={self.tensor(s, 1)})",
                lambda: f"{name} = dict(zip(['a', 'b'], [{self.tensor(s, 1)}, {self.tensor(s, 1)}]))",
                lambda: f"{name} = {{k: {self.tensor(s, 1)} for k in ('a', 'b')}}",
            ])())
            s.bind(name, "dict")
            s.keys[name] = ["a", "b"]
            return
        name = self.fresh("q")
        source = self.pick(s, "list")
        if source is None:
            self.emit(indent, f"{name} = ({self.tensor(s, 1)},) * {self.c.integer(0, 2)}")
        else:
            self.emit(indent, f"{name} = tuple({source}[{self.c.integer(0, 2)}:])")
        s.bind(name, "seq")

    def unpack(self, s: Scope, indent: int) -> None:
        a, b = self.fresh("h"), self.fresh("h")
        choice = self.c.integer(0, 8)
        if choice == 0:
            self.emit(indent, f"{a}, {b} = {self.tensor(s, 1)}, {self.tensor(s, 1)}")
        elif choice == 1 and len(s.writable("tensor")) >= 2:
            a, b = s.writable("tensor")[:2]
            self.emit(indent, f"{a}, {b} = {b}, {a}")
        elif choice == 2 and s.names("list"):
            rest = self.fresh("rest")
            lst = self.pick(s, "list")
            self.emit(indent, self.c.choice([f"{a}, *{rest} = {lst}", f"*{rest}, {a} = {lst}"]))
            s.bind(rest, "seq")
            s.bind(a, "tensor")
            return
        elif choice == 3:
            self.emit(indent, f"{a}, {b} = torch.cat([{self.tensor(s, 1)}, {self.tensor(s, 1)}]).chunk(2, 0)")
        elif choice == 4:
            k = self.fresh("iv")
            self.emit(indent, f"({a}, {b}), {k} = ({self.tensor(s, 1)}, {self.tensor(s, 1)}), {self.integer(s, 1)}")
            s.bind(k, "int")
        elif choice == 5 and s.names("list"):
            self.emit(indent, f"{a}, {b} = {self.pick(s, 'list')}[:2]")
        elif choice == 6 and self.c.chance(50):
            k, m = self.fresh("iv"), self.fresh("iv")
            self.emit(indent, self.c.choice([f"{k}, {m} = {self.tensor(s, 1)}.shape",
                                             f"{k}, *_, {m} = {self.tensor(s, 1)}.unsqueeze(1).shape"]))
            s.bind(k, "int")
            s.bind(m, "int")
            return
        elif choice == 7:
            self.emit(indent, f"{a} = {b} = {self.tensor(s, 1)}, {self.tensor(s, 1)}")
            self.emit(indent, f"{a}, {b} = {a}")
        else:
            q, r = self.fresh("iv"), self.fresh("iv")
            self.emit(indent, f"{q}, {r} = divmod({self.integer(s, 1)}, {self.c.integer(1, 3)})")
            s.bind(q, "int")
            s.bind(r, "int")
            return
        s.bind(a, "tensor")
        s.bind(b, "tensor")

    def assert_or_raise(self, s: Scope, indent: int) -> None:
        if self.c.chance(50):
            self.emit(indent, f"assert {self.boolean(s, 1)}, {self.string(s, 1)}")
        else:
            self.emit(indent, f"if {self.boolean(s, 1)}:")
            exc = self.c.choice(["ValueError", "RuntimeError", "KeyError", "IndexError"])
            if self.c.chance(25):
                self.emit(indent + 1, f"raise {exc}")
            else:
                self.emit(indent + 1, f"raise {exc}(f\"bad {{{self.integer(s, 1)}}}\")")

    def delete(self, s: Scope, indent: int) -> None:
        names = [n for n in s.writable("tensor") if n not in ("x", "y")]
        if not names:
            return self.assign_tensor(s, indent)
        name = self.c.choice(names)
        self.emit(indent, f"del {name}")
        s.unbind(name)

    def expression_statement(self, s: Scope, indent: int) -> None:
        options = [lambda: f"{self.tensor(s, 2)}"]
        if s.names("counter"):
            options.append(lambda: f"{self.pick(s, 'counter')}()")
        lists = [n for n in s.writable("list") if n not in s.frozen]
        if lists:
            name = self.c.choice(lists)
            options.append(lambda: f"{name}.pop() if len({name}) > 1 else None")
        self.emit(indent, self.c.choice(options)())

    def raising_statement(self, s: Scope, indent: int) -> None:
        self.emit(indent, f"{self.fresh('r')} = {self.raising(s)}")

    def state_mutation(self, s: Scope, indent: int) -> None:
        self.emit(indent, self.c.choice([
            lambda: f"self.buf.add_({self.tensor(s, 1)}.mean(0).detach())",
            lambda: "self.count += 1",
            lambda: f"self.buf[{self.c.integer(0, 3)}] = {self.integer(s, 1)}",
            lambda: "self.steps += 1",
            lambda: f"self.last = {self.tensor(s, 1)}.detach()",
        ])())

    def early_return(self, s: Scope, indent: int) -> None:
        self.emit(indent, f"return {self.returned(s)}")

    def handler_statement(self, s: Scope, indent: int) -> None:
        name = s.handler
        self.emit(indent, self.c.choice([
            lambda: f"{self.fresh('sv')} = str({name})[:{self.c.integer(5, 40)}]",
            lambda: f"{self.fresh('sv')} = type({name}).__name__",
            lambda: "raise",
            lambda: f"raise ValueError('wrapped') from {name}",
            lambda: f"raise RuntimeError(f\"again {{type({name}).__name__}}\")",
        ])())

    def loop_jump(self, s: Scope, indent: int) -> None:
        self.emit(indent, f"if {self.boolean(s, 1)}:")
        self.emit(indent + 1, self.c.choice(["break", "continue"]))

    def unsupported_statement(self, s: Scope, indent: int) -> None:
        name = self.fresh("iv")
        lines = self.c.choice([
            ["import math", f"{name} = math.floor(2.5)"],
            ["class Tmp:", "    value = 2", f"{name} = Tmp.value"],
            [f"{name} = 0", "async def coro():", "    return 1"],
        ])
        for line in lines:
            self.emit(indent, line)
        s.bind(name, "int")

    # -- results ----------------------------------------------------------------------------------

    def returned(self, s: Scope) -> str:
        """What a body returns: a tensor for helpers and closures, anything for the forward."""
        if s.owner != "forward":
            return self.tensor(s, 2)
        t = lambda: self.tensor(s, 2)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (10, t),
            (4, lambda: f"{t()}, {self.integer(s, 1)}"),
            (2, lambda: f"{{'out': {t()}, 'n': {self.integer(s, 1)}, 'tag': {self.string(s, 1)}}}"),
            (2, lambda: f"[{t()}, {t()}]"),
            (2, lambda: f"{t()}.{self.c.choice(DTYPE_CHANGES)}"),
            (1, lambda: f"{t()}, ({t()}, {self.boolean(s, 1)})"),
            (1, lambda: self.integer(s, 2)),
            (1, lambda: self.string(s, 2)),
            (1, lambda: "None"),
        ]
        for kind, weight, make in [
            ("list", 2, lambda: self.pick(s, "list")),
            ("dict", 2, lambda: self.pick(s, "dict")),
            ("set", 1, lambda: f"sorted({self.pick(s, 'set')})"),
            ("seq", 1, lambda: f"{t()}, {self.pick(s, 'seq')}"),
        ]:
            if s.names(kind):
                table.append((weight, make))
        return self.c.weighted(table)()


DTYPE_CHANGES = ["argmax(-1)", "gt(0)", "double()", "sum()", "to(torch.int32)", "half()", "long()",
                 "bool().any()", "max(dim=1)", "sort(dim=1)", "unbind(0)", "split([1, 3], dim=1)"]
