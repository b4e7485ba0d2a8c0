"""The expression half of the forward grammar: typed random expressions over the variables in scope.

Every variable has a kind, and every production returns source text of one kind, so generated
programs mostly run (and raise only where the grammar means them to):

    tensor  a float32 tensor of shape (2, 4)        int     a small Python int
    bool    a Python bool (never a tensor)          str     a Python str
    list    a non-empty list of (2, 4) tensors      seq     a tuple or list of tensors, maybe empty
    dict    str -> tensor, with known keys          opts    a **kwargs dict, keys unknown
    func    a callable tensor -> tensor             module  a child module tensor -> tensor
    set     a set of ints                           counter a no-argument callable returning an int

String literals use single quotes and f-strings double quotes, so any expression can sit inside an
f-string field on Python 3.10 and 3.11. Depends on the standard library and `choices` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .choices import Chooser

__all__ = ["Scope", "ExpressionGrammar", "KINDS"]

KINDS = ("tensor", "int", "bool", "str", "list", "seq", "dict", "opts", "func", "module", "set", "counter")


@dataclass
class Scope:
    """The variables a statement may read or write, by kind, and what the position allows."""

    vars: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    keys: dict[str, list[str]] = field(default_factory=dict)  # dict variable -> keys known present
    readonly: set[str] = field(default_factory=set)  # closure reads, loop counters: never assigned
    frozen: set[str] = field(default_factory=set)  # containers being iterated: never resized
    maybe: list[tuple[str, str]] = field(default_factory=list)  # (name, kind) possibly unbound here
    owner: str = "forward"  # forward | helper | child | closure
    loop: bool = False
    handler: Optional[str] = None  # the exception name inside an `except ... as name` body
    has_self: bool = True
    has_containers: bool = True

    def copy(self) -> "Scope":
        return Scope(vars={k: list(v) for k, v in self.vars.items()}, keys={k: list(v) for k, v in self.keys.items()},
                     readonly=set(self.readonly), frozen=set(self.frozen), maybe=list(self.maybe), owner=self.owner,
                     loop=self.loop, handler=self.handler, has_self=self.has_self,
                     has_containers=self.has_containers)

    def names(self, kind: str) -> list[str]:
        return self.vars[kind]

    def writable(self, kind: str) -> list[str]:
        return [n for n in self.vars[kind] if n not in self.readonly]

    def bind(self, name: str, kind: str) -> None:
        for other in KINDS:
            if other != kind and name in self.vars[other]:
                self.vars[other].remove(name)
        if name not in self.vars[kind]:
            self.vars[kind].append(name)
        self.maybe = [(n, k) for n, k in self.maybe if n != name]

    def unbind(self, name: str) -> None:
        for kind in KINDS:
            if name in self.vars[kind]:
                self.vars[kind].remove(name)
                self.maybe.append((name, kind))
        self.keys.pop(name, None)

    def absorb(self, inner: "Scope") -> None:
        """After a nested body: what it bound may be bound here; what it deleted may be unbound."""
        for kind in KINDS:
            for name in inner.vars[kind]:
                if name not in self.vars[kind] and (name, kind) not in self.maybe:
                    self.maybe.append((name, kind))
            for name in list(self.vars[kind]):
                if name not in inner.vars[kind]:
                    self.unbind(name)
        for name, keys in inner.keys.items():
            if name in self.keys:
                self.keys[name] = [k for k in self.keys[name] if k in keys]


class ExpressionGrammar:
    """Random expressions; `StatementGrammar` (statements.py) builds on it."""

    def __init__(self, chooser: Chooser):
        self.c = chooser
        self.counter = 0
        self.names = False  # the "names" family: reads of module names the forward rebinds (NAME_READS)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def pick(self, scope: Scope, kind: str) -> Optional[str]:
        """A variable of `kind`; now and then one that may be unbound (CPython raises on the read)."""
        maybe = [n for n, k in scope.maybe if k == kind]
        if maybe and self.c.chance(3):
            return self.c.choice(maybe)
        names = scope.names(kind)
        return self.c.choice(names) if names else None

    def with_var(self, scope: Scope, kind: str, name: str) -> Scope:
        inner = scope.copy()
        inner.bind(name, kind)
        inner.readonly.add(name)
        return inner

    # -- tensors ------------------------------------------------------------------------------

    def tensor(self, s: Scope, d: int) -> str:
        if d <= 0 or self.c.chance(30):
            return self.tensor_leaf(s)
        t: Callable[[], str] = lambda: self.tensor(s, d - 1)  # noqa: E731
        i = lambda: self.integer(s, d - 1)  # noqa: E731
        b = lambda: self.boolean(s, d - 1)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (6, lambda: f"{t()} + {t()}"),
            (4, lambda: f"{t()} * {t()}"),
            (3, lambda: f"{t()} - {t()}"),
            (2, lambda: f"{t()} * {self.c.choice(['0.5', '2', '-1.5'])}"),
            (2, lambda: f"{t()} / {self.c.choice(['2.0', '4', '-3.0'])}"),
            (1, lambda: f"-{t()}"),
            (2, lambda: f"{t()} * {i()}"),
            (6, lambda: self.c.choice(UNARY_FUNCS).format(t())),
            (8, lambda: f"{t()}.{self.c.choice(UNARY_METHODS)}"),
            (2, lambda: f"torch.where({t()} > 0, {t()}, {t()})"),
            (1, lambda: f"torch.maximum({t()}, {t()})"),
            (1, lambda: f"torch.add({t()}, {t()}, alpha={self.c.integer(-2, 2)})"),
            (1, lambda: f"{t()}.lerp({t()}, 0.25)"),
            (1, lambda: f"torch.stack([{t()}, {t()}]).sum(0)"),
            (1, lambda: f"torch.cat([{t()}, {t()}], dim=1)[:, 2:6]"),
            (1, lambda: f"{t()}.masked_fill({t()} > 0.5, 0.0)"),
            (1, lambda: f"F.dropout({t()}, p=0.5, training=self.training)" if s.has_self else t()),
            (1, lambda: f"{t()} + torch.rand_like({t()})"),
            (2, lambda: f"{t()} if {b()} else {t()}"),
            (2, lambda: f"scaled({t()})" if self.c.chance(50) else f"scaled({t()}, k={i()})"),
            (1, lambda: f"scaled(*[{t()}], k={self.number(s, 0)})"),
            (1, lambda: f"{t()} * {self.number(s, d - 1)}"),
        ]
        if s.has_self:
            table += [
                (5, lambda: f"self.lin({t()})"),
                (1, lambda: f"self.lin(input={t()})"),
                (1, lambda: f"getattr(self, 'lin')({t()})"),
                (1, lambda: f"{t()}[None].squeeze(0)"),
                (2, lambda: f"{t()} @ self.weight"),
                (1, lambda: f"{t()} * self.scale"),
                (1, lambda: f"{t()} + self.buf"),
            ]
        if s.has_containers:
            table += [
                (2, lambda: f"self.layers[{self.c.integer(-3, 2)}]({t()})"),
                (1, lambda: f"self.layers[{i()} % 3]({t()})"),
                (2, lambda: f"self.blocks[{self.c.choice(BLOCK_KEYS)!r}]({t()})"),
                (2, lambda: f"self.seq({t()})"),
                (1, lambda: f"self.seq[{self.c.integer(0, 2)}]({t()})"),
                (2, lambda: f"self.child({t()})"),
                (1, lambda: f"self.child.forward({t()})"),
                (4, lambda: self.helper_call(s, d - 1)),
                (1, lambda: f"self.seq[1:]({t()})"),
                (1, lambda: f"self.base_helper({t()})"),
                (1, lambda: f"self.scale_by({t()})" if self.c.chance(50) else f"self.scale_by({t()}, k={i()})"),
            ]
            if s.owner == "forward":
                table.append((1, lambda: f"super().scale_by({t()})"))
        for kind, weight, make in self._container_tensor_forms(s, d):
            if s.names(kind):
                table.append((weight, make))
        if self.names:  # only then: the other programs of a seed stay what they were
            table += [(14, lambda: self.c.choice(NAME_READS).format(t()))]
        return f"({self.c.weighted(table)()})"

    def _container_tensor_forms(self, s: Scope, d: int) -> list:
        t = lambda: self.tensor(s, d - 1)  # noqa: E731
        lst = lambda: self.pick(s, "list")  # noqa: E731
        u = self.fresh("u")
        inner = self.with_var(s, "tensor", u)
        return [
            ("list", 2, lambda: f"{lst()}[{self.c.choice(['0', '-1'])}]"),
            ("list", 1, lambda: f"torch.stack({lst()}).mean(0)"),
            ("list", 1, lambda: f"sum({lst()}, {t()})"),
            ("list", 1, lambda: f"max({lst()}, key=lambda {u}: {u}.sum().item())"),
            ("list", 2, lambda: f"sum([{self.tensor(inner, d - 1)} for {u} in {lst()}], {t()})"),
            ("list", 1, lambda: f"sum(({self.tensor(inner, d - 1)} for {u} in {lst()} if {self.boolean(inner, d - 1)}),"
                                f" {t()})"),
            ("list", 1, lambda: f"next(({u} for {u} in {lst()} if {self.boolean(inner, d - 1)}), {t()})"),
            ("list", 1, lambda: f"torch.stack(tuple({self.tensor(inner, d - 1)} for {u} in {lst()})).sum(0)"),
            ("list", 1, lambda: f"torch.cat([*{lst()}, {t()}]).sum(0, keepdim=True).expand(2, 4)"),
            ("list", 1, lambda: self._nested_comprehension(s, d)),
            ("list", 1, lambda: f"self.combine({t()}, *{lst()}, {t()})" if s.has_containers else t()),
            ("seq", 1, lambda: f"sum({self.pick(s, 'seq')}, {t()})"),
            ("seq", 1, lambda: f"(list({self.pick(s, 'seq')}) + [{t()}])[0]"),
            ("dict", 2, lambda: self._dict_read(s, d)),
            ("dict", 1, lambda: f"{self.pick(s, 'dict')}.get('zz', {t()})"),
            ("opts", 1, lambda: f"{self.pick(s, 'opts')}.get('bias', {t()})"),
            ("func", 3, lambda: f"{self.pick(s, 'func')}({t()})"),
            ("module", 3, lambda: f"{self.pick(s, 'module')}({t()})"),
        ]

    def _nested_comprehension(self, s: Scope, d: int) -> str:
        a, b = self.fresh("u"), self.fresh("u")
        inner = self.with_var(self.with_var(s, "tensor", a), "tensor", b)
        condition = f" if {self.boolean(inner, 0)}" if self.c.chance(50) else ""
        return (f"sum([{self.tensor(inner, d - 1)} for {a} in {self.pick(s, 'list')} "
                f"for {b} in {self.pick(s, 'list')}{condition}], {self.tensor(s, d - 1)})")

    def _dict_read(self, s: Scope, d: int) -> str:
        name = self.pick(s, "dict")
        keys = s.keys.get(name) or []
        if not keys:
            return f"{name}.get('a', {self.tensor(s, d - 1)})"
        return f"{name}[{self.c.choice(keys)!r}]"

    def tensor_leaf(self, s: Scope) -> str:
        name = self.pick(s, "tensor")
        table: list[tuple[int, Callable[[], str]]] = [(20, lambda: name)] if name else []
        table += [
            (1, lambda: "torch.ones(2, 4)"),
            (1, lambda: f"torch.full((2, 4), {self.c.choice(['0.5', '-1.0', '3.0'])})"),
            (1, lambda: "torch.linspace(-1, 1, 8).view(2, 4)"),
        ]
        if s.has_self:
            table += [(1, lambda: "self.weight[:2]"), (1, lambda: "self.buf.expand(2, 4)")]
        return self.c.weighted(table)()

    def helper_call(self, s: Scope, d: int) -> str:
        """A call of the Model's `helper(self, a, *rest, scale=1.0, **opts)` in one of its shapes."""
        t = lambda: self.tensor(s, d)  # noqa: E731
        forms = [
            lambda: f"self.helper({t()})",
            lambda: f"self.helper({t()}, {t()}, scale={self.c.choice(['0.5', '2.0'])})",
            lambda: f"self.helper({t()}, bias={t()})",
            lambda: f"self.combine({t()}, {t()})",
            lambda: f"self.combine(*[{t()}, {t()}], weight={self.c.choice(['0.5', '1.5'])})",
        ]
        if s.names("list"):
            forms.append(lambda: f"self.helper(*{self.pick(s, 'list')})")
            forms.append(lambda: f"self.combine(*{self.pick(s, 'list')})")
        if s.names("dict"):
            forms.append(lambda: f"self.helper({t()}, **{self.pick(s, 'dict')})")
        return self.c.choice(forms)()

    # -- ints, bools, strings ---------------------------------------------------------------------

    def integer(self, s: Scope, d: int) -> str:
        if d <= 0 or self.c.chance(35):
            name = self.pick(s, "int")
            if name and self.c.chance(70):
                return name
            return str(self.c.integer(0, 4))
        i = lambda: self.integer(s, d - 1)  # noqa: E731
        t = lambda: self.tensor(s, d - 1)  # noqa: E731
        b = lambda: self.boolean(s, d - 1)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (4, lambda: f"{i()} + {i()}"),
            (2, lambda: f"{i()} - {i()}"),
            (2, lambda: f"{i()} * {self.c.integer(2, 3)}"),
            (2, lambda: f"{i()} % {self.c.integer(2, 4)}"),
            (1, lambda: f"{i()} // 2"),
            (1, lambda: f"-{i()}"),
            (1, lambda: f"abs({i()})"),
            (2, lambda: f"max({i()}, {i()})"),
            (2, lambda: f"min({i()}, {i()})"),
            (1, lambda: f"int({b()})"),
            (2, lambda: f"{t()}.dim()"),
            (2, lambda: f"{t()}.shape[{self.c.integer(0, 1)}]"),
            (1, lambda: f"{t()}.size(-1)"),
            (1, lambda: f"int({t()}.argmax())"),
            (2, lambda: f"int(({t()} > 0).sum().item())"),
            (1, lambda: f"round({t()}.mean().item() * 3)"),
            (1, lambda: f"{i()} if {b()} else {i()}"),
        ]
        if s.names("list"):
            table += [(2, lambda: f"len({self.pick(s, 'list')})")]
            u = self.fresh("u")
            inner = self.with_var(s, "tensor", u)
            table += [(1, lambda: f"sum(1 for {u} in {self.pick(s, 'list')} if {self.boolean(inner, d - 1)})")]
        if s.names("dict"):
            table += [(1, lambda: f"len({self.pick(s, 'dict')})")]
        if s.names("str"):
            table += [(1, lambda: f"len({self.pick(s, 'str')})")]
        if s.names("set"):
            table += [(1, lambda: f"len({self.pick(s, 'set')})")]
        if s.names("seq"):
            table += [(1, lambda: f"len({self.pick(s, 'seq')})")]
        if s.names("counter"):
            table += [(1, lambda: f"{self.pick(s, 'counter')}()")]
        return f"({self.c.weighted(table)()})"

    def boolean(self, s: Scope, d: int) -> str:
        t = lambda: self.tensor(s, max(d - 1, 0))  # noqa: E731
        i = lambda: self.integer(s, max(d - 1, 0))  # noqa: E731
        b = lambda: self.boolean(s, d - 1)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (6, lambda: f"bool({t()}.sum() > {self.c.choice(['0', '1.5', '-1'])})"),
            (4, lambda: f"{t()}.mean() > {t()}.mean()"),
            (4, lambda: f"{i()} {self.c.choice(['>', '<', '==', '!=', '>=', '<='])} {i()}"),
            (1, lambda: f"0 <= {i()} < 3"),
            (1, lambda: f"{i()} in (1, 2)"),
            (1, lambda: f"isinstance({t()}, torch.Tensor)"),
            (1, lambda: f"{t()}.shape == (2, 4)"),
            (1, lambda: "self.training" if s.has_self else "True"),
            (1, lambda: f"torch.is_tensor({t()})"),
            (1, lambda: "type(self).__name__ == 'Model'" if s.has_self else "TRAIN"),
            (1, lambda: f"len({t()}) == 2"),
            (1, lambda: f"hasattr(self, {self.c.choice(['lin', 'nope', 'last'])!r})" if s.has_self else "True"),
        ]
        if d > 0:
            table += [
                (2, lambda: f"{b()} and {b()}"),
                (2, lambda: f"{b()} or {b()}"),
                (1, lambda: f"not {b()}"),
                (1, lambda: self.lazy_any(s, d - 1)),
            ]
        flag = self.pick(s, "bool")
        if flag:
            table.append((3, lambda: flag))
        if s.names("dict"):
            table.append((1, lambda: f"{self.c.choice(['a', 'b', 'zz'])!r} in {self.pick(s, 'dict')}"))
        if s.names("opts"):
            table.append((1, lambda: f"'bias' in {self.pick(s, 'opts')}"))
        if s.names("str"):
            table.append((1, lambda: f"{self.pick(s, 'str')}.startswith('a')"))
        if s.names("set"):
            table.append((1, lambda: f"{i()} in {self.pick(s, 'set')}"))
        if s.names("list") and d > 0:
            u = self.fresh("u")
            inner = self.with_var(s, "tensor", u)
            table.append((1, lambda: f"{self.c.choice(['any', 'all'])}({self.boolean(inner, d - 1)} "
                                     f"for {u} in {self.pick(s, 'list')})"))
            table.append((1, lambda: f"len({self.pick(s, 'list')}) > 1"))
        return f"({self.c.weighted(table)()})"

    def lazy_any(self, s: Scope, d: int) -> str:
        """any/all over a generator whose later elements raise: eager stops at the first decisive one."""
        j = self.fresh("j")
        inner = self.with_var(s, "int", j)
        raising = self.c.choice([
            lambda: f"[{self.tensor(s, 0)}, {self.tensor(s, 0)}][{j}].sum() > 0",
            lambda: f"{self.tensor(s, 0)}[{j}].sum() > 0",
            lambda: f"10 // (1 - {j}) > 3",
        ])()
        fn = self.c.choice(["any", "all"])
        return f"{fn}({self.boolean(inner, d)} {'or' if fn == 'any' else 'and'} {raising} for {j} in range(3))"

    def string(self, s: Scope, d: int) -> str:
        name = self.pick(s, "str")
        if d <= 0 or self.c.chance(30):
            return name if name and self.c.chance(70) else repr(self.c.choice(["ab", "x", "mode"]))
        st_ = lambda: self.string(s, d - 1)  # noqa: E731
        i = lambda: self.integer(s, 0)  # noqa: E731
        t = lambda: self.tensor(s, 0)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (4, lambda: f'f"{{{i()}}}-{{{i()}:>3}}"'),
            (2, lambda: f'f"{{{t()}.shape[1]}}/{{{t()}.sum().item():.2f}}"'),
            (1, lambda: f'f"{{{i()}!r:>4}}"'),
            (2, lambda: f"str({i()})"),
            (2, lambda: f"{st_()} + {st_()}"),
            (1, lambda: f"{st_()}.upper()"),
            (1, lambda: f"'-'.join([{st_()}, {st_()}])"),
            (1, lambda: f"{st_()}[:3]"),
        ]
        return f"({self.c.weighted(table)()})"

    # -- expressions that raise (now or for some values) ------------------------------------------

    def raising(self, s: Scope) -> str:
        t = lambda: self.tensor(s, 1)  # noqa: E731
        i = lambda: self.integer(s, 1)  # noqa: E731
        table: list[tuple[int, Callable[[], str]]] = [
            (3, lambda: f"{t()}.view(3, 3)"),
            (2, lambda: f"{t()} @ {t()}"),
            (2, lambda: f"torch.cat([{t()}, {t()}.t()])"),
            (3, lambda: f"{t()}[{i()} + 1]"),
            (2, lambda: f"{i()} // ({i()} - {i()})"),
            (1, lambda: f"int({self.string(s, 1)})"),
            (1, lambda: f"{t()}.sum(dim=3)"),
            (1, lambda: f"[][{i()}]"),
            (1, lambda: "torch.zeros(2, 4)[::-1]"),
            (1, lambda: f"{t()}.item()"),
            (1, lambda: f"F.linear({t()}, torch.ones(3, 3))"),
            (1, lambda: f"torch.tensor([1.0, 2.0]) + {t()}"),
            (1, lambda: f"scaled({t()}, {t()}, {t()})"),
        ]
        if s.names("list"):
            table.append((2, lambda: f"{self.pick(s, 'list')}[len({self.pick(s, 'list')}) - {i()}]"))
        if s.names("dict"):
            table.append((2, lambda: f"{self.pick(s, 'dict')}[{self.c.choice(['a', 'b', 'missing'])!r}]"))
        if s.names("func"):
            table.append((1, lambda: f"{self.pick(s, 'func')}({t()}, {t()}, {t()})"))
            table.append((1, lambda: f"{self.pick(s, 'func')}()"))
            table.append((1, lambda: f"{self.pick(s, 'func')}({t()}, zz={t()})"))
        if s.has_self:
            table.append((1, lambda: "self.weight.add_(1.0)"))
            table.append((1, lambda: f"self.lin({t()}, {t()})"))
            table.append((1, lambda: f"getattr(self, 'missing_' + {self.string(s, 0)})"))
        if s.has_containers:
            table += [
                (1, lambda: "self.helper()"),
                (1, lambda: f"self.helper({t()}, a={t()})"),
                (1, lambda: "self.combine()"),
                (1, lambda: f"self.child({t()}, {t()})"),
                (1, lambda: f"self.child(x={t()}, y={t()})"),
                (1, lambda: f"self.blocks['zz']({t()})"),
                (1, lambda: f"self.layers[3]({t()})"),
                (1, lambda: self.lazy_zip(s)),
            ]
        return self.c.weighted(table)()

    def lazy_zip(self, s: Scope) -> str:
        """zip stops at its shortest input: a generator after it is not asked for more elements."""
        j = self.fresh("j")
        return (f"sum(a.sum() for a, _ in zip([{self.tensor(s, 0)}], "
                f"({self.tensor(s, 0)}[{j}] for {j} in range({self.c.integer(2, 4)}))))")

    def number(self, s: Scope, d: int) -> str:
        """A Python float."""
        table: list[tuple[int, Callable[[], str]]] = [
            (2, lambda: self.c.choice(["0.5", "1.25", "-2.0"])),
            (2, lambda: f"{self.tensor(s, d)}.mean().item()"),
            (1, lambda: f"float({self.integer(s, d)})"),
            (1, lambda: f"{self.integer(s, d)} / {self.c.choice(['3', '2.0'])}"),
            (1, lambda: f"round({self.tensor(s, d)}.sum().item(), 2)"),
        ]
        return f"({self.c.weighted(table)()})"


UNARY_FUNCS = ["torch.relu({})", "torch.sigmoid({})", "torch.tanh({})", "F.gelu({})", "F.silu({})", "torch.abs({})",
               "F.softplus({})", "torch.sin({})", "F.layer_norm({}, (4,))", "torch.neg({})", "F.normalize({}, dim=-1)"]
UNARY_METHODS = [
    "tanh()", "relu()", "abs()", "clamp(min=-1.0, max=1.0)", "softmax(dim=-1)", "cumsum(1)", "flip(0)",
    "roll(1, 1)", "t().t()", "reshape(4, 2).reshape(2, 4)", "view(-1).view(2, 4)", "exp().clamp(max=8.0)",
    "mean(dim=-1, keepdim=True).expand(2, 4)", "unsqueeze(0).squeeze(0)", "detach()", "clone()",
    "contiguous()", "sort(dim=-1).values", "max(dim=-1, keepdim=True)[0].expand(2, 4)", "float()",
    "pow(2)", "square()", "sum(0, keepdim=True).repeat(2, 1)", "new_zeros(2, 4)", "transpose(0, 1).T",
    "chunk(2, 0)[0].repeat(2, 1)", "sign()", "round(decimals=1)", "to(torch.float32)", "flatten().view(2, 4)",
    "__getitem__((slice(None), [3, 2, 1, 0]))", "index_select(1, torch.tensor([1, 0, 3, 2]))",
]
BLOCK_KEYS = ["a", "b", "c"]
# The "names" family (programs.NAMES_HEADER): a module global, a global function, an attribute of a
# module object and a class attribute, each read where the forward may just have rebound it.
NAME_READS = ["{} * G", "ACT({})", "{} * LIB.K", "{} * Knobs.FACTOR", "{} + G * Knobs.FACTOR"]
NAME_REBINDS = ["set_g({number})", "use_act({act})", "LIB.K = {number}", "Knobs.FACTOR = {number}", "bump()",
                "set_k({number})"]
