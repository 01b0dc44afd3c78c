"""Static check for invariant 2, the part ruff cannot do: no call that blocks the thread
inside an ``async def``.

ruff's ``ASYNC`` rules (selected in pyproject.toml) report, in an ``async def`` itself,
``time.sleep``, ``open``, ``input``, pathlib and os.path I/O, processes (subprocess, ``os.system``,
``os.wait*``) and HTTP with requests, httpx or urllib. This check reports what ruff does not
know about: the Django ORM, transactions and connections, the cache, mail, django-q2's
broker calls, the ``runpod`` SDK, thread/process/future joins, thread locks, events and queues,
executor shutdowns, sockets and name resolution, ``shutil``; and any call, on the loop, of one of
the module's own functions that blocks, ruff's families included (ruff sees only the calls
written in the async def). It reads every ``.py`` file of the project (AST only, nothing is
imported).

What it looks at and what it does not:

- The body of each ``async def``, not the bodies of nested ``def``, ``lambda``
  or ``class`` (they run later, elsewhere): ``asyncio.to_thread(lambda: f())``
  is correct. Their decorators and default values run now and are checked.
- Only calls. A function handed over by reference is not called on the loop:
  ``to_thread(cache.get, key)``, ``loop.run_in_executor(ex, f)``,
  ``sync_to_async(f)(...)``, ``database_sync_to_async(f)`` are correct.
- Names are resolved through each module's imports (``from django.core.cache import cache
  as c`` is ``django.core.cache.cache``). Receivers are typed where the module says what
  they are (``t = threading.Thread(...)``, ``self.pool = ThreadPoolExecutor(1)``,
  ``sock: socket.socket``) or where the name says it (``thread.join()``,
  ``sock.recv()``).
- A call that is awaited, used by ``async with``/``async for``, or handed to
  ``create_task``/``ensure_future``/``gather``/``wait_for``/``shield``/``wait``
  returns an awaitable, so the method heuristics (ORM, ``.save()``, ``.delete()``)
  and the ``runpod`` family let it pass; functions that are always synchronous
  (``cache.get``, ``transaction.atomic``, ``async_task``...) never pass.
- One step further inside a module: calling, on the loop, a module-level
  function or a method of the same class that itself blocks (directly or
  through other such local functions) is reported at the call.

Run it by hand with ``python -m tools.blocking_check [paths...]``; the
test suite runs it over the whole project, tools/ included (tests/test_no_blocking_calls.py,
which also proves that ruff's configuration still reports its families).

Length: a test tool, not part of the product, and one module of ~690 lines on purpose: the
tables of what blocks, the module context that types receivers, the scanner and the entry
points are one analysis whose private helpers call each other both ways (the scanner asks the
module which local functions block; the module runs scanners to find out). Split, every part
would import the others' underscored names; tests/tools/test_blocking_check.py pins what it does.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

EXCLUDED_DIRS = frozenset(
    {".venv", "venv", "env", "node_modules", "__pycache__", "migrations", "var", "static", "build", "dist"}
)

# -- what blocks ---------------------------------------------------------------------------------

JOIN = "waits for another thread or process"
SHUTDOWN = "joins the executor's threads (shutdown(wait=False) does not)"
SOCKET = "blocking socket I/O"
DNS = "blocking name resolution"
RUNPOD = "the runpod SDK is synchronous HTTP"
FILE = "file I/O"
ORM = "a database round trip (Django ORM)"
DATABASE = "a database round trip"
BROKER = "a broker or database round trip (django-q2)"
CACHE = "a cache round trip"
MAIL = "an SMTP round trip"
LOCK = "waits on a thread synchronisation primitive"
FUTURE = "waits for a concurrent future"

_SHUTIL = "copy copy2 copyfile copyfileobj copytree move rmtree make_archive unpack_archive".split()
_DJANGO_Q = (
    "async_task async_iter async_chain schedule result result_group fetch fetch_group count_group delete_group "
    "queue_size"
).split()
_CACHE_METHODS = "get set add delete get_or_set get_many set_many delete_many has_key incr decr touch clear".split()

# Always synchronous: reported even when (wrongly) awaited.
FUNCTIONS: dict[str, str] = {
    "socket.create_connection": SOCKET,
    **{f"socket.{name}": DNS for name in "getaddrinfo gethostbyname gethostbyname_ex gethostbyaddr getfqdn".split()},
    **{f"shutil.{name}": FILE for name in _SHUTIL},
    "concurrent.futures.wait": FUTURE,
    "concurrent.futures.as_completed": FUTURE,
    "django.db.transaction.atomic": DATABASE,
    "django.db.close_old_connections": DATABASE,
    **{f"django.db.connection.{name}": DATABASE for name in ("cursor", "ensure_connection", "close")},
    "django.shortcuts.get_object_or_404": ORM,
    "django.shortcuts.get_list_or_404": ORM,
    **{f"django.contrib.auth.{name}": ORM for name in ("authenticate", "login", "logout", "get_user")},
    "django.core.management.call_command": "runs a management command",
    **{f"django.core.mail.{name}": MAIL for name in ("send_mail", "send_mass_mail", "mail_admins", "mail_managers")},
    **{f"django_q.tasks.{name}": BROKER for name in _DJANGO_Q},
    **{f"django.core.cache.cache.{name}": CACHE for name in _CACHE_METHODS},
}
# Functions (not classes) under these prefixes block unless awaited (async variants return awaitables).
FAMILIES: dict[str, str] = {"runpod.": RUNPOD}

# What ruff's ASYNC rules report in an async def itself. This check does not repeat them there; it
# looks for them only in the module's own functions, which ruff does not follow from the loop.
_RUFF = "blocking by ruff's ASYNC rules"
_HTTP_VERBS = "get post put patch delete head options request".split()
RUFF_FUNCTIONS: frozenset[str] = frozenset(
    {"time.sleep", "open", "io.open", "input", "os.system", "os.popen", "os.wait", "os.waitpid",
     "urllib.request.urlopen",
     *(f"subprocess.{name}" for name in "run call check_call check_output getoutput getstatusoutput Popen".split()),
     *(f"{client}.{verb}" for client in ("requests", "httpx") for verb in _HTTP_VERBS)}
)  # fmt: skip
RUFF_METHODS = frozenset({"read_text", "read_bytes", "write_text", "write_bytes"})  # pathlib's whole-file I/O

# What a call returns, for typing the receivers of later calls.
_ASYNC_OBJECTS = (
    "asyncio.create_subprocess_exec asyncio.create_subprocess_shell asyncio.Event asyncio.Lock asyncio.Semaphore "
    "asyncio.Condition asyncio.Queue httpx.AsyncClient"
).split()
CONSTRUCTORS: dict[str, str] = {
    **dict.fromkeys("threading.Thread threading.Timer multiprocessing.Process".split(), "thread"),
    "subprocess.Popen": "popen",
    **dict.fromkeys("socket.socket socket.create_connection socket.create_server socket.fromfd".split(), "socket"),
    **{f"concurrent.futures.{name}": "executor" for name in ("ThreadPoolExecutor", "ProcessPoolExecutor")},
    "concurrent.futures.thread.ThreadPoolExecutor": "executor",
    "concurrent.futures.Future": "future",
    "asyncio.run_coroutine_threadsafe": "future",
    **dict.fromkeys("threading.Event threading.Barrier multiprocessing.Event".split(), "event"),
    **{f"threading.{name}": "lock" for name in ("Lock", "RLock", "Semaphore", "BoundedSemaphore")},
    "multiprocessing.Lock": "lock",
    "threading.Condition": "condition",
    **{f"queue.{name}": "queue" for name in ("Queue", "LifoQueue", "PriorityQueue", "SimpleQueue")},
    "multiprocessing.Queue": "queue",
    **dict.fromkeys(_ASYNC_OBJECTS, "async"),  # typed so that the name heuristics leave them alone
}
_SOCKET_METHODS = (
    "recv recv_into recvfrom recvfrom_into recvmsg send sendall sendto sendmsg sendfile accept connect".split()
)
TYPE_METHODS: dict[str, dict[str, str]] = {
    "thread": {"join": JOIN},
    # ruff reports making a Popen in an async def, not waiting for one made elsewhere (self.proc)
    "popen": {"wait": JOIN, "communicate": JOIN},
    "socket": dict.fromkeys(_SOCKET_METHODS, SOCKET),
    "executor": {"shutdown": SHUTDOWN},
    "future": {"result": FUTURE, "exception": FUTURE},
    "event": {"wait": LOCK},
    "lock": {"acquire": LOCK},
    "condition": {"wait": LOCK, "wait_for": LOCK, "acquire": LOCK},
    "queue": {"get": LOCK, "put": LOCK, "join": LOCK},
}
# (method, keyword, value) that make a blocking method return at once.
NON_BLOCKING_KEYWORDS = {("shutdown", "wait"), ("get", "block"), ("put", "block"), ("acquire", "blocking")}

# Method names that block whatever the receiver (unless awaited): the ORM's model methods, sockets.
METHOD_NAMES: dict[str, str] = {
    **dict.fromkeys(("save", "delete", "refresh_from_db", "full_clean"), ORM),
    **dict.fromkeys(("recv", "recv_into", "recvfrom", "sendall"), SOCKET),
}
# Receivers that the name gives away, when the module does not type them.
NAMED_RECEIVERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("thread",), "thread"),
    (("sock", "socket"), "socket"),
    (("proc", "process", "popen"), "popen"),
)

# QuerySet methods that build a query without running it; the a-prefixed ones are async.
LAZY_QUERYSET = frozenset(
    {"all", "filter", "exclude", "order_by", "select_related", "prefetch_related", "annotate", "alias", "values",
     "values_list", "only", "defer", "using", "distinct", "none", "reverse", "extra", "select_for_update", "union",
     "intersection", "difference", "dates", "datetimes", "complex_filter", "raw"}
)  # fmt: skip
ASYNC_QUERYSET = frozenset(
    {"aget", "acreate", "aget_or_create", "aupdate_or_create", "abulk_create", "abulk_update", "acount", "ain_bulk",
     "aiterator", "alatest", "aearliest", "afirst", "alast", "aaggregate", "aexists", "acontains", "aupdate",
     "adelete", "aexplain"}
)  # fmt: skip
MANAGERS = frozenset({"objects", "_default_manager", "_base_manager"})
EVALUATORS = frozenset({"list", "tuple", "set", "frozenset", "dict", "len", "sorted", "sum", "any", "all", "bool"})
# Callables whose arguments are coroutines or awaitables, not blocking calls.
HANDOFF = frozenset({"ensure_future", "create_task", "gather", "wait_for", "shield", "wait", "as_completed",
                     "run_coroutine_threadsafe", "start_soon"})  # fmt: skip


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    call: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.call}: {self.why}"


# -- module context ------------------------------------------------------------------------------


def _qualname(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression refers to through the module's imports, or None."""
    if isinstance(node, ast.Name):
        if node.id in aliases:
            return aliases[node.id]
        return node.id if node.id in ("open", "input") else None
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _identifier(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _imports(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    return aliases


@dataclass
class _Scope:
    """What is known while scanning one function body."""

    module: _Module
    cls: ast.ClassDef | None
    types: dict[str, str] = field(default_factory=dict)  # "name" or "self.attr" -> kind
    locals: set[str] = field(default_factory=set)

    def type_of(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.types.get(node.id) or self.module.types.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            if self.cls is not None:
                return self.module.class_types.get(self.cls.name, {}).get(node.attr)
            return None
        if isinstance(node, ast.Await):
            return self.type_of(node.value)
        if isinstance(node, ast.Call):
            name = _qualname(node.func, self.module.aliases)
            if name in CONSTRUCTORS:
                return CONSTRUCTORS[name]
            if isinstance(node.func, ast.Attribute):
                receiver = self.type_of(node.func.value)
                if receiver == "executor" and node.func.attr == "submit":
                    return "future"
        return None


def _annotation_type(node: ast.AST | None, aliases: dict[str, str]) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_type(ast.parse(node.value, mode="eval").body, aliases)
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_type(node.left, aliases) or _annotation_type(node.right, aliases)
    if isinstance(node, ast.Subscript):  # Optional[X]
        return _annotation_type(node.slice, aliases)
    return CONSTRUCTORS.get(_qualname(node, aliases) or "")


def _bind(target: ast.AST, kind: str | None, types: dict[str, str], names: set[str] | None = None) -> None:
    if isinstance(target, ast.Name):
        if names is not None:
            names.add(target.id)
        if kind:
            types[target.id] = kind
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        if kind:
            types[f"self.{target.attr}"] = kind
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            _bind(element, None, types, names)


def _own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node of a function body, not entering nested functions, lambdas or classes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _learn_types(scope: _Scope, nodes: Iterable[ast.AST], *, into_self: dict[str, str] | None = None) -> None:
    """Type the names a body assigns (flow-insensitive: the module says what a name holds)."""
    for node in nodes:
        if isinstance(node, ast.Assign):
            kind = scope.type_of(node.value)
            for target in node.targets:
                if (
                    isinstance(target, ast.Tuple)
                    and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Attribute)
                    and node.value.func.attr == "accept"
                    and scope.type_of(node.value.func.value) == "socket"
                    and target.elts
                ):
                    _bind(target.elts[0], "socket", scope.types, scope.locals)
                    continue
                _bind(target, kind, scope.types, scope.locals)
                if into_self is not None and kind and isinstance(target, ast.Attribute):
                    into_self.setdefault(target.attr, kind)
        elif isinstance(node, ast.AnnAssign):
            kind = _annotation_type(node.annotation, scope.module.aliases) or (
                scope.type_of(node.value) if node.value is not None else None
            )
            _bind(node.target, kind, scope.types, scope.locals)
            if into_self is not None and kind and isinstance(node.target, ast.Attribute):
                into_self.setdefault(node.target.attr, kind)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None:
                    _bind(item.optional_vars, scope.type_of(item.context_expr), scope.types, scope.locals)
        elif isinstance(node, ast.For | ast.AsyncFor):
            iterable = _identifier(node.iter) or ""
            kind = "thread" if iterable.lower().endswith("threads") else None
            _bind(node.target, kind, scope.types, scope.locals)


class _Module:
    def __init__(self, tree: ast.Module, path: str):
        self.tree = tree
        self.path = path
        self.aliases = _imports(tree)
        self.types: dict[str, str] = {}
        self.class_types: dict[str, dict[str, str]] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.methods: dict[str, dict[str, ast.FunctionDef]] = {}
        self.coroutine_functions: set[str] = set()
        self.coroutine_methods: dict[str, set[str]] = {}
        module_scope = _Scope(self, None)
        _learn_types(module_scope, tree.body)
        self.types = module_scope.types
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.AsyncFunctionDef):
                self.coroutine_functions.add(node.name)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            attrs: dict[str, str] = {}
            for item in cls.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    kind = _annotation_type(item.annotation, self.aliases)
                    if kind:
                        attrs[item.target.id] = kind
            self.class_types[cls.name] = attrs
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    scope = _Scope(self, cls)
                    _learn_types(scope, _own_nodes(item.body), into_self=attrs)
            self.methods[cls.name] = {i.name: i for i in cls.body if isinstance(i, ast.FunctionDef)}
            self.coroutine_methods[cls.name] = {i.name for i in cls.body if isinstance(i, ast.AsyncFunctionDef)}
        self._blocking: dict[tuple[str, str], str] | None = None

    def scope_for(self, function: ast.FunctionDef | ast.AsyncFunctionDef, cls: ast.ClassDef | None) -> _Scope:
        scope = _Scope(self, cls)
        args = function.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                scope.locals.add(arg.arg)
                kind = _annotation_type(arg.annotation, self.aliases)
                if kind:
                    scope.types[arg.arg] = kind
        _learn_types(scope, _own_nodes(function.body))
        return scope

    # -- local functions that block ----------------------------------------------------------------

    def makes_coroutine(self, call: ast.Call, scope: _Scope) -> bool:
        """A call of an ``async def`` of this module (or class): it only creates a coroutine."""
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in self.coroutine_functions and func.id not in self.aliases and func.id not in scope.locals
        return (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")
            and scope.cls is not None
            and func.attr in self.coroutine_methods.get(scope.cls.name, set())
        )

    def local_callee(self, call: ast.Call, scope: _Scope) -> tuple[str, str] | None:
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in self.functions and func.id not in self.aliases and func.id not in scope.locals:
                return ("", func.id)
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")
            and scope.cls is not None
            and func.attr in self.methods.get(scope.cls.name, {})
        ):
            return (scope.cls.name, func.attr)
        return None

    def blocking_functions(self) -> dict[tuple[str, str], str]:
        """Module-level functions and methods (sync) that block, with the reason, to a fixed point."""
        if self._blocking is not None:
            return self._blocking
        calls: dict[tuple[str, str], list[tuple[ast.Call, tuple[str, str]]]] = {}
        blocking: dict[tuple[str, str], str] = {}
        classes = {c.name: c for c in ast.walk(self.tree) if isinstance(c, ast.ClassDef)}
        units = [(("", name), fn, None) for name, fn in self.functions.items()]
        units += [
            ((cls, name), fn, classes[cls]) for cls, methods in self.methods.items() for name, fn in methods.items()
        ]
        for key, function, cls in units:
            scanner = _Scanner(self, self.scope_for(function, cls), local=True)
            scanner.scan(function.body)
            if scanner.findings:
                first = scanner.findings[0]
                blocking[key] = f"{first.call} at line {first.line} ({first.why})"
            calls[key] = scanner.local_calls
        changed = True
        while changed:
            changed = False
            for key, callees in calls.items():
                if key in blocking:
                    continue
                for call, callee in callees:
                    if callee in blocking:
                        blocking[key] = f"it calls {_callee_text(callee)} at line {call.lineno}, which blocks"
                        changed = True
                        break
        self._blocking = blocking
        return blocking


def _callee_text(key: tuple[str, str]) -> str:
    return f"{key[1]}()" if not key[0] else f"self.{key[1]}()"


def _call_text(call: ast.Call) -> str:
    text = ast.unparse(call)
    if len(text) <= 80:
        return text
    func = ast.unparse(call.func)
    return (func if len(func) <= 72 else func[:69] + "...") + "(...)"


def _orm_chain(node: ast.AST) -> bool:
    """True when the expression is built on a model manager (``Model.objects....``)."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if node.attr in MANAGERS:
                return True
            node = node.value
        else:
            return False


def _non_blocking_arguments(call: ast.Call, method: str) -> bool:
    for keyword in call.keywords:
        if (method, keyword.arg) in NON_BLOCKING_KEYWORDS:
            return isinstance(keyword.value, ast.Constant) and keyword.value.value is False
    if method in ("acquire", "get") and call.args:
        first = call.args[0]
        return isinstance(first, ast.Constant) and first.value is False
    if method == "put" and len(call.args) >= 2:
        second = call.args[1]
        return isinstance(second, ast.Constant) and second.value is False
    return False


class _Scanner(ast.NodeVisitor):
    """Finds blocking calls in one function body (not entering nested scopes).

    ``local``: the body of one of the module's own functions, scanned to learn whether calling it
    blocks; there ruff's families count too, and calls of other local functions are only noted.
    """

    def __init__(self, module: _Module, scope: _Scope, *, local: bool = False):
        self.module = module
        self.scope = scope
        self.local = local
        self.findings: list[Finding] = []
        self.local_calls: list[tuple[ast.Call, tuple[str, str]]] = []
        self._awaitable: set[int] = set()  # ids of calls whose result is awaited or handed to the loop

    def scan(self, body: list[ast.stmt]) -> None:
        for statement in body:
            self.visit(statement)

    def report(self, node: ast.AST, call: str, why: str) -> None:
        self.findings.append(Finding(self.module.path, node.lineno, node.col_offset, call, why))

    # nested scopes: what runs now (decorators, defaults, bases) is checked, the body is not
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for expr in (*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)):
            self.visit(expr)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in (*node.args.defaults, *(d for d in node.args.kw_defaults if d)):
            self.visit(expr)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            self.visit(expr)

    # what returns an awaitable
    def _mark_awaitable(self, node: ast.AST | None) -> None:
        if isinstance(node, ast.Call):
            self._awaitable.add(id(node))
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            for element in node.elts:
                self._mark_awaitable(element)
        elif isinstance(node, ast.Starred):
            self._mark_awaitable(node.value)
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            self._mark_awaitable(node.elt)

    def visit_Await(self, node: ast.Await) -> None:
        self._mark_awaitable(node.value)
        self.generic_visit(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        for item in node.items:
            self._mark_awaitable(item.context_expr)
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._mark_awaitable(node.iter)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        if _orm_chain(node.iter):
            text = ast.unparse(node.iter)
            self.report(node.iter, f"for ... in {text if len(text) <= 80 else text[:77] + '...'}",
                        "iterates a queryset: " + ORM)  # fmt: skip
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if _identifier(node.func) in HANDOFF:
            for argument in (*node.args, *(k.value for k in node.keywords)):
                self._mark_awaitable(argument)
        self.check(node)
        self.generic_visit(node)

    def check(self, call: ast.Call) -> None:
        awaitable = id(call) in self._awaitable
        aliases = self.module.aliases
        if self.module.makes_coroutine(call, self.scope):
            return
        local = self.module.local_callee(call, self.scope)
        if local is not None:
            # a function of this module: what its body does decides, not the name
            self.local_calls.append((call, local))
            why = self.module.blocking_functions().get(local) if not self.local and not awaitable else None
            if why:
                self.report(call, _call_text(call), f"a function of this module that blocks: {why}")
            return
        shadowed = isinstance(call.func, ast.Name) and call.func.id in self.scope.locals
        name = None if shadowed else _qualname(call.func, aliases)
        if name is not None:
            if name in FUNCTIONS:
                self.report(call, _call_text(call), FUNCTIONS[name])
                return
            if self.local and name in RUFF_FUNCTIONS:
                self.report(call, _call_text(call), _RUFF)
                return
            for prefix, why in FAMILIES.items():
                last = name.rsplit(".", 1)[-1]
                # functions only: constructing a class (an endpoint, an exception) calls nobody
                if name.startswith(prefix) and not awaitable and not last[:1].isupper():
                    self.report(call, _call_text(call), why)
                    return
        if awaitable:
            return
        if isinstance(call.func, ast.Name) and call.func.id in EVALUATORS and call.args and _orm_chain(call.args[0]):
            if call.func.id not in aliases:
                self.report(call, _call_text(call), "evaluates a queryset: " + ORM)
                return
        if isinstance(call.func, ast.Attribute):
            self._check_method(call, call.func)

    def _check_method(self, call: ast.Call, func: ast.Attribute) -> bool:
        method = func.attr
        receiver = func.value
        if _orm_chain(receiver):
            if method in LAZY_QUERYSET or method in ASYNC_QUERYSET or method.startswith("_"):
                return False
            self.report(call, _call_text(call), ORM)
            return True
        kind = self.scope.type_of(receiver)
        if kind is None:
            identifier = (_identifier(receiver) or "").lower().rstrip("_")
            for endings, named_kind in NAMED_RECEIVERS:
                if identifier.endswith(endings) and method in TYPE_METHODS[named_kind]:
                    kind = named_kind
                    break
        if kind in TYPE_METHODS and method in TYPE_METHODS[kind]:
            if _non_blocking_arguments(call, method):
                return False
            self.report(call, _call_text(call), TYPE_METHODS[kind][method])
            return True
        if kind is None and method in METHOD_NAMES:
            self.report(call, _call_text(call), METHOD_NAMES[method])
            return True
        if kind is None and self.local and method in RUFF_METHODS:
            self.report(call, _call_text(call), _RUFF)
            return True
        return False


# -- entry points --------------------------------------------------------------------------------


def check_source(source: str, path: str = "<source>") -> list[Finding]:
    """Every blocking call inside the ``async def`` bodies of one module."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        return [Finding(path, exc.lineno or 0, 0, "<module>", f"cannot be parsed: {exc.msg}")]
    module = _Module(tree, path)
    findings: list[Finding] = []

    def walk(node: ast.AST, cls: ast.ClassDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.AsyncFunctionDef):
                scanner = _Scanner(module, module.scope_for(child, cls))
                scanner.scan(child.body)
                findings.extend(scanner.findings)
            walk(child, child if isinstance(child, ast.ClassDef) else cls)

    walk(tree, None)
    return sorted(set(findings))


def project_files(root: Path) -> Iterator[Path]:
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in EXCLUDED_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory) / name


def check_paths(paths: Iterable[Path], *, root: Path | None = None) -> list[Finding]:
    findings: list[Finding] = []
    for path in paths:
        files = project_files(path) if path.is_dir() else [path]
        for file in files:
            shown = str(file.relative_to(root)) if root and file.is_relative_to(root) else str(file)
            findings.extend(check_source(file.read_text(encoding="utf-8"), shown))
    return findings


def check_project(root: Path | None = None) -> list[Finding]:
    root = (root or Path(__file__).resolve().parent.parent).resolve()
    return check_paths([root], root=root)


def main(argv: list[str]) -> int:
    root = Path.cwd().resolve()
    findings = check_paths([Path(a).resolve() for a in argv], root=root) if argv else check_project()
    for finding in findings:
        print(finding)
    print(f"{len(findings)} blocking call(s) inside async def", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
