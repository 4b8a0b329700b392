"""`Books` (gpuledger.core.books.books) is the one writer of its own tables: no other module of the core
assigns to, deletes from, or calls a mutating method on one of them, or on a record held in one (a gang's
`GroupState`, a `Reservation`). Read from the source, not run: a write on any path, however rare, shows.

A table is reached through the books (`books.<table>`, `self.books.<table>`, `self._books.<table>`, any
`<x>.books`/`<x>._books`, a name bound to one of these or annotated `Books`) or through a name bound in the
same function to something reached so (`group = books.groups.get(key)`, `for g in books.groups.values()`),
annotated with a record's type, or built as one (`GroupState(...)`: built whole, then handed to the books).
The tables are the attributes `Books.__init__` sets: a table added there is checked too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import gpuledger.core

CORE = Path(gpuledger.core.__file__).parent
BOOKS = CORE / "books" / "books.py"
MUTATING = {"pop", "setdefault", "update", "clear", "append", "add", "discard", "remove", "__setitem__"}
MUTATING |= {"__delitem__", "popitem", "extend", "appendleft", "extendleft", "insert"}
RECORDS = {"GroupState", "Reservation"}  # the mutable records the books' tables hold
BOOKS_NAMES = {"books", "_books"}

# The ledger's facade (gpuledger/core/ledger.py) writes this one itself, by line content: the setter of the
# properties it shares with the books (config, index, performance, ...: `_shared`), which replace the whole
# attribute, as an operator's new settings do
LEDGER_WRITES = {
    "setattr(self._books, name, value)",
}


def _tables() -> set[str]:
    """The attributes `Books.__init__` sets on the books."""
    tree = ast.parse(BOOKS.read_text())
    books = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Books")
    init = next(f for f in books.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    out = set()
    for n in ast.walk(init):
        targets = (
            n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        )
        out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"}
    out.discard("_events")  # (the listener given at construction, not a table)
    return out


TABLES = _tables()


def _annotated(annotation: ast.expr | None, names: set[str]) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    return any(part in names for part in text.replace("|", " ").replace('"', " ").replace("'", " ").split())


class _Scope:
    """The names of one function (or of a module's top level) bound to the books, or to their tables."""

    def __init__(self, body: ast.AST) -> None:
        self.books: set[str] = {"books"}
        self.held: set[str] = set()
        args = body.args if isinstance(body, ast.FunctionDef | ast.AsyncFunctionDef) else None
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if args is not None else []:
            if _annotated(a.annotation, {"Books"}):
                self.books.add(a.arg)
            elif _annotated(a.annotation, RECORDS):
                self.held.add(a.arg)
        bindings = list(_bindings(body))
        changed = True
        while changed:  # to a fixed point: `g = books.groups[k]` then `claims = g.claims`
            changed = False
            for target, value, annotation in bindings:
                names = _names(target)
                if not names:
                    continue
                if value is not None and self.is_books(value) and not names <= self.books:
                    self.books |= names
                    changed = True
                elif (
                    (value is not None and (self.reaches(value) or _builds_record(value)))
                    or _annotated(annotation, RECORDS)
                ) and not names <= self.held:
                    self.held |= names
                    changed = True

    def is_books(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.books
        return isinstance(e, ast.Attribute) and e.attr in BOOKS_NAMES

    def reaches(self, e: ast.expr) -> str | None:
        """The table (or the held name) `e` reaches down its chain of attributes, subscripts and calls."""
        while isinstance(e, ast.Attribute | ast.Subscript | ast.Call):
            if isinstance(e, ast.Attribute) and e.attr in TABLES and self.is_books(e.value):
                return e.attr
            e = e.func if isinstance(e, ast.Call) else e.value
        return e.id if isinstance(e, ast.Name) and e.id in self.held else None


def _names(target: ast.expr) -> set[str]:
    """The names a binding's target binds (none for an attribute or an item: that is a write, not a name)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_names(t) for t in target.elts))
    return set()


def _sets_attribute(n: ast.AST) -> bool:
    """Whether `n` is a call of `setattr` or `delattr` (with an object to set on)."""
    return (
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in ("setattr", "delattr")
        and bool(n.args)
    )


def _builds_record(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in RECORDS


def _bindings(body: ast.AST) -> Iterator[tuple[ast.expr, ast.expr | None, ast.expr | None]]:
    """(target, value, annotation) of every name bound in `body`, not in the functions nested in it."""
    todo = list(ast.iter_child_nodes(body))
    while todo:
        n = todo.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        todo.extend(ast.iter_child_nodes(n))
        if isinstance(n, ast.Assign):
            for t in n.targets:
                yield t, n.value, None
        elif isinstance(n, ast.AnnAssign):
            yield n.target, n.value, n.annotation
        elif isinstance(n, ast.NamedExpr):
            yield n.target, n.value, None
        elif isinstance(n, ast.For | ast.AsyncFor | ast.comprehension):
            yield n.target, n.iter, None
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            yield n.optional_vars, n.context_expr, None


def _writes(body: ast.AST, scope: _Scope) -> Iterator[tuple[int, str]]:
    """(line, table or held name) of every write in `body` (not in the functions nested in it)."""
    todo = list(ast.iter_child_nodes(body))
    while todo:
        n = todo.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        todo.extend(ast.iter_child_nodes(n))
        targets: list[ast.expr] = []
        if isinstance(n, ast.Assign | ast.Delete):
            targets = list(n.targets)
        elif isinstance(n, ast.AugAssign | ast.AnnAssign) and n.value is not None:
            targets = [n.target]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATING:
            if (what := scope.reaches(n.func.value)) is not None:  # (a held name's own method too)
                yield n.lineno, what
        elif _sets_attribute(n) and (scope.is_books(n.args[0]) or scope.reaches(n.args[0])):
            yield n.lineno, "setattr"
        for t in targets:
            for one in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                if isinstance(one, ast.Name):
                    continue  # (rebinding a name writes nothing)
                if isinstance(one, ast.Attribute) and scope.is_books(one.value) and one.attr in TABLES:
                    yield n.lineno, one.attr  # the table itself replaced
                elif (what := scope.reaches(one)) is not None:
                    yield n.lineno, what


def writes_outside_books() -> list[str]:
    """'path:line: what: source line' of every write of the books' tables outside books.py."""
    out = []
    for path in sorted(CORE.rglob("*.py")):
        if path == BOOKS:
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        bodies = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
        for body in bodies:
            for line, what in _writes(body, _Scope(body)):
                text = lines[line - 1].strip()
                if path.name == "ledger.py" and path.parent == CORE and text in LEDGER_WRITES:
                    continue
                out.append(f"{path.relative_to(CORE.parent.parent)}:{line}: {what}: {text}")
    return sorted(set(out))


def test_only_the_books_write_their_tables() -> None:
    assert writes_outside_books() == []


def test_the_check_sees_each_kind_of_write() -> None:
    """The check itself: each kind of write, through each way of reaching a table, is found."""
    source = """
def f(self, books, now):
    books.pods["k"] = "pod:k"
    self.books.pending.pop("r", None)
    self._books.groups.setdefault("g", None)
    del books.slot_of["h"]
    books.problems.append("x")
    books.last_now += 1
    books.rr_cursor = "n"
    group = self.books.groups.get("g")
    group.claims[0] = None
    claims = group.claims
    claims.update({})
    for res in books.reservations.values():
        res.state = None
    made = GroupState("g", {}, {}, now)
    made.slot_taints = {}
    b = self._books
    b.pod_gpus.clear()
    setattr(books, "config", None)
def g(res: Reservation, books: Books):
    res.issued = None
    books.holdings.__setitem__("h", None)
def h(self, books):
    x = books.reservations.get("r")
    y = {k: v for k, v in books.groups.items()}
    books.hold(x)
    later = lambda k: books.pods.pop(k)
    mine = {}
    mine["k"] = len(books.pods)
"""
    tree = ast.parse(source)
    found = []
    for body in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        found += [line for line, _ in _writes(body, _Scope(body))]
    reads = (
        "group =",
        "claims =",
        "for ",
        "made =",
        "b =",
        "x =",
        "y =",
        "mine =",
        "books.hold(",
    )  # no write
    want = [
        i + 1
        for i, text in enumerate(source.splitlines())
        if text.startswith("    ") and not text.strip().startswith(reads) and "len(books" not in text
    ]
    assert sorted(found) == want
