"""Where a loop without a DataLoader makes its batch: the lines that assign the model's inputs.

Without a DataLoader, the time of a step outside compute is not all data: a ``time.sleep``,
logging, a ``loss.item()`` sync or a checkpoint write between ``optimizer.step()`` and the
next forward are in it too. Only the time spent making the batch is data, so the profile
needs to know which lines make it. At the model's first training forward,
:func:`batch_lines` reads the statement that calls the model in the user's frame, takes
the names in it that hold tensors (``X, Y`` in ``logits, loss = model(X, Y)``; ``batch``
in ``model(**batch)``), and finds, in the source of that frame's function, every statement
that assigns one of them (``X, Y = get_batch('train')``, ``x = augment(x)``, the header of
``for x, y in batches:``), following the names those statements read in turn (``ix`` in
``x = data[ix]``). A name that is a parameter of the function is followed into its caller.
A batch made inline (``model(torch.randn(8, 4))``) makes the calling statement itself the
batch line.

The stack sampler (:mod:`hasten.profile.inject.sampler`) counts a sample outside compute
as data only when a frame on the stack is at one of these lines; the rest of that time is
named by its file and line, never called data.

Changes the training math: no (the source is read, nothing is changed).
"""

from __future__ import annotations

import ast
import copy
import inspect
import os
from functools import lru_cache

from hasten.profile.inject.user_code import is_users, named

MAX_FRAMES = 3  # callers followed when the batch comes in as a parameter


def batch_lines(frame) -> dict:
    """``{code object: set of line numbers}`` where the batch reaching the model's forward is made.

    ``frame``: any frame inside the forward call (the hook's own); the first frame of the
    user's code above it is the one that called the model. Empty when no source is found."""
    f = frame
    while f is not None and not is_users(f.f_code.co_filename):
        f = f.f_back
    out: dict = {}
    for _ in range(MAX_FRAMES):
        if f is None:
            break
        fn = _function_node(f.f_code.co_filename, f.f_code.co_firstlineno, f.f_code.co_name)
        if fn is None:
            break
        call = _statement_at(fn, f.f_lineno)
        if call is None:
            break
        names = {n for n in _loaded_names(call) if _holds_tensors(f, n)}
        if not names:  # made inline, in the calling statement itself
            out.setdefault(f.f_code, set()).update(_lines(call))
            break
        lines, unresolved = _assignments(fn, names, f)
        if lines:
            out.setdefault(f.f_code, set()).update(lines)
        params = _parameters(f.f_code)
        if not (unresolved & params):
            break
        f = f.f_back
        while f is not None and not is_users(f.f_code.co_filename):
            f = f.f_back
    return out


def _holds_tensors(frame, name: str) -> bool:
    import torch
    if name in frame.f_locals:
        value = frame.f_locals[name]
    elif name in frame.f_globals:
        value = frame.f_globals[name]
    else:
        return False
    return _has_tensor(value, torch.Tensor, 2)


def _has_tensor(value, tensor_type, depth: int) -> bool:
    if isinstance(value, tensor_type):
        return True
    if depth <= 0:
        return False
    if isinstance(value, dict):
        return any(_has_tensor(v, tensor_type, depth - 1) for v in list(value.values())[:8])
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v, tensor_type, depth - 1) for v in value[:8])
    return False


@lru_cache(maxsize=32)
def _tree(filename: str):
    try:
        with open(filename, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=os.path.basename(filename))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _function_node(filename: str, firstlineno: int, name: str):
    tree = _tree(filename)
    if tree is None:
        return None
    if name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if firstlineno in (first, node.lineno):
                return node
    return None


def _own_statements(fn):
    """The statements of a function's body (or a module's), not those of functions or classes defined in it."""
    todo = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.stmt):
            yield node
        todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]


def _statement_at(fn, line: int):
    """The innermost simple statement that holds ``line`` (a compound one's header when none does)."""
    best = None
    for node in _own_statements(fn):
        end = getattr(node, "end_lineno", node.lineno) or node.lineno
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)):
            end = _header_end(node)
        if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
            best = node
    return best


def _header_end(node) -> int:
    head = {ast.For: "iter", ast.AsyncFor: "iter", ast.While: "test", ast.If: "test"}.get(type(node))
    if head is not None:
        return getattr(node, head).end_lineno
    if isinstance(node, (ast.With, ast.AsyncWith)) and node.items:
        return node.items[-1].context_expr.end_lineno
    return node.lineno


def _lines(node) -> set[int]:
    end = _header_end(node) if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With,
                                                 ast.AsyncWith, ast.Try)) else node.end_lineno
    return set(range(node.lineno, (end or node.lineno) + 1))


def _loaded_names(node) -> set[str]:
    """Names read by a statement (for a compound one, by its header)."""
    parts = [node]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        parts = [node.iter]
    elif isinstance(node, (ast.While, ast.If)):
        parts = [node.test]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        parts = [item.context_expr for item in node.items]
    return {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound_names(target) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound_names(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    if isinstance(target, ast.Subscript):  # batch["x"] = ...: changes batch
        return _bound_names(target.value)
    return set()


def _binds(node) -> tuple[set[str], object]:
    """The names a statement assigns, and the expression it reads them from."""
    if isinstance(node, ast.Assign):
        return set().union(*(_bound_names(t) for t in node.targets)), node.value
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return _bound_names(node.target), node.value
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _bound_names(node.target), node.iter
    if isinstance(node, (ast.With, ast.AsyncWith)):
        names = set()
        for item in node.items:
            if item.optional_vars is not None:
                names |= _bound_names(item.optional_vars)
        return names, None
    return set(), None


def _assignments(fn, names: set[str], frame) -> tuple[set[int], set[str]]:
    """Lines of the statements that assign ``names`` (and, in turn, the tensors they read), and the
    names no statement assigns."""
    stmts = [(s, *_binds(s)) for s in _own_statements(fn)]
    lines: set[int] = set()
    todo, seen, assigned = set(names), set(), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for node, bound, value in stmts:
            if name not in bound:
                continue
            assigned.add(name)
            lines |= _lines(node)
            if value is not None:
                for n in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} - seen - todo:
                    if _holds_tensors(frame, n):
                        todo.add(n)
    return lines, seen - assigned


def _parameters(code) -> set[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    return set(code.co_varnames[:n])


# ---- what a line that makes the batch does (the fixes must fit it: issue 32, item 5)

def line_shape(frame) -> dict:
    """What the statement at a sampled frame's line does, for the fixes to fit the script:

    - ``per_row``: it builds the batch row by row in a comprehension (``torch.stack([... for i
      in ix])``), a Python loop over the rows (:func:`_over_rows`);
    - ``rows_at_once``: where that comprehension stacks slices of one array at offsets
      (nanoGPT's ``data[i:i+block_size]`` windows), the statement rewritten to index every
      row at once (:func:`rows_at_once`);
    - ``prepared``: its function reads prepared data already (``np.memmap``, ``mmap_mode``):
      "prepare the data once" would be advice to do what it does.

    Empty where the source cannot be read."""
    f = named(frame)
    fn = _function_node(f.f_code.co_filename, f.f_code.co_firstlineno, f.f_code.co_name)
    if fn is None:
        return {}
    stmt = _statement_at(fn, frame.f_lineno)
    if stmt is None:
        return {}
    out = {"per_row": any(_over_rows(n) for n in ast.walk(stmt)),
           "prepared": any((isinstance(n, ast.Attribute) and n.attr == "memmap") or
                           (isinstance(n, ast.Name) and n.id == "memmap") or
                           (isinstance(n, ast.keyword) and n.arg == "mmap_mode") for n in ast.walk(fn))}
    vectorised = rows_at_once(stmt)
    if vectorised:
        out["rows_at_once"] = vectorised
    return out


def _over_rows(node) -> bool:
    """A comprehension over the batch's rows: over anything but a ``range(...)`` (a handful of
    columns, as regression's ``torch.cat([x ** i for i in range(1, 5)], 1)``, is no loop per row)."""
    if not isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return False
    it = node.generators[0].iter
    return not (isinstance(it, ast.Call) and _is_name(it.func, "range"))


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _offset(lower, i: str):
    """``A`` where ``lower`` is ``i + A`` (or ``A + i``), ``0`` where it is ``i``; None otherwise."""
    if _is_name(lower, i):
        return 0
    if isinstance(lower, ast.BinOp) and isinstance(lower.op, ast.Add):
        if _is_name(lower.left, i):
            return lower.right
        if _is_name(lower.right, i):
            return lower.left
    return None


def rows_at_once(stmt) -> str | None:
    """``x = torch.stack([f(data[i + a:i + a + w]) for i in ix])`` rewritten as one index of every row:
    ``x = f(data[(ix[:, None] + a + torch.arange(w)).numpy()])``, or None where the statement is not
    that shape (one comprehension over one name, stacking one window of one array per row, ``f``
    anything that works on a whole array as on a row, as ``.astype`` and ``torch.from_numpy`` do).

    The rows are the same, in the same order: one numpy fancy index gathers them all in C,
    where the comprehension makes a slice, an array and a tensor per row in Python."""
    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    func = call.func
    if not ((isinstance(func, ast.Attribute) and func.attr == "stack") or _is_name(func, "stack")):
        return None
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], (ast.ListComp, ast.GeneratorExp)):
        return None
    comp = call.args[0]
    if len(comp.generators) != 1 or comp.generators[0].ifs or not isinstance(comp.generators[0].target, ast.Name):
        return None
    i, ix = comp.generators[0].target.id, comp.generators[0].iter
    windows = []

    class Gather(ast.NodeTransformer):
        def visit_Subscript(self, node):
            node = self.generic_visit(node)
            s = node.slice
            if not (isinstance(s, ast.Slice) and s.step is None and s.lower is not None and s.upper is not None):
                return node
            off = _offset(s.lower, i)
            up = s.upper
            if off is None or not (isinstance(up, ast.BinOp) and isinstance(up.op, ast.Add)
                                   and ast.dump(up.left) == ast.dump(s.lower)):
                return node
            rows = ast.Subscript(value=ix, slice=ast.Tuple(elts=[ast.Slice(), ast.Constant(None)], ctx=ast.Load()),
                                 ctx=ast.Load())
            arange = ast.Call(func=ast.Attribute(value=ast.Name("torch", ast.Load()), attr="arange", ctx=ast.Load()),
                              args=[up.right], keywords=[])
            index = rows if off == 0 else ast.BinOp(rows, ast.Add(), off)
            index = ast.BinOp(index, ast.Add(), arange)
            windows.append(node)
            return ast.Subscript(value=node.value, ctx=ast.Load(), slice=ast.Call(
                func=ast.Attribute(value=index, attr="numpy", ctx=ast.Load()), args=[], keywords=[]))

    elt = Gather().visit(copy.deepcopy(comp.elt))
    if len(windows) != 1 or any(_is_name(n, i) for n in ast.walk(elt)):
        return None
    return ast.unparse(ast.fix_missing_locations(ast.Assign(targets=stmt.targets, value=elt, lineno=stmt.lineno)))


def rewrite_rows(fn) -> int:
    """Replace ``fn``'s code with its own, each statement :func:`rows_at_once` can rewrite rewritten
    (a verification run of that fix: :mod:`hasten.profile.inject.batch_fn`). The statements rewritten;
    0 and nothing changed where there are none, the source is unreadable, or ``fn`` is a closure (its
    free variables would be read as globals)."""
    code = fn.__code__
    node = _function_node(code.co_filename, code.co_firstlineno, code.co_name)
    if node is None or node is _tree(code.co_filename) or code.co_freevars:
        return 0
    new = copy.deepcopy(node)
    new.decorator_list = []
    changed = 0
    for parent in ast.walk(new):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(parent, field, None)
            if not isinstance(stmts, list):
                continue
            for i, stmt in enumerate(stmts):
                text = rows_at_once(stmt) if isinstance(stmt, ast.stmt) else None
                if text:
                    stmts[i] = ast.copy_location(ast.parse(text).body[0], stmt)
                    changed += 1
    if not changed:
        return 0
    compiled = compile(ast.fix_missing_locations(ast.Module(body=[new], type_ignores=[])), code.co_filename, "exec")
    scope: dict = {}
    exec(compiled, fn.__globals__, scope)  # the def binds its name in `scope`, reading the script's globals
    fn.__code__ = scope[code.co_name].__code__
    return changed


def batch_function(frame, lines: dict):
    """``(namespace, name, function)`` of the user's function that makes the batch: a name called on the
    lines that make it (``X, Y = get_batch('train')``) in the frame that called the model, found in that
    frame's module globals. None where there is none."""
    f = frame
    while f is not None and not is_users(f.f_code.co_filename):
        f = f.f_back
    if f is None or f.f_code not in lines:
        return None
    fn_node = _function_node(f.f_code.co_filename, f.f_code.co_firstlineno, f.f_code.co_name)
    if fn_node is None:
        return None
    wanted = lines[f.f_code]
    for stmt in _own_statements(fn_node):
        if stmt.lineno not in wanted:
            continue
        for call in ast.walk(stmt):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                obj = f.f_globals.get(call.func.id)
                code = getattr(obj, "__code__", None)
                # a generator function's call only makes the generator: its batches come in the loop's
                # next(), which its timing would never see
                if (code is not None and is_users(code.co_filename) and call.func.id not in f.f_code.co_varnames
                        and not code.co_flags & (inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
                                                 | inspect.CO_COROUTINE)):
                    return f.f_globals, call.func.id, obj
    return None


# Calls that draw the values of data (not indices into data already made): a batch function built on
# them makes its data fresh each call, and a fixed set made once is other data (it changes the math).
_VALUE_DRAWS = {"randn", "rand", "normal", "randn_like", "rand_like", "normal_", "uniform_", "uniform",
                "standard_normal", "random", "random_sample", "gauss", "multivariate_normal", "bernoulli",
                "poisson", "exponential_"}
IN_MEMORY_ROWS = 10_000  # an array of at least this many elements that the function reads: its data, made once


def function_shape(fn) -> dict:
    """What the script's batch function does with its data, for "prepare the data once" to fit it:

    - ``draws_values``: it calls a random value generator (``torch.randn``, ``np.random.normal``, ...):
      its data is made fresh each call, and a set made once is other data (it changes the math);
    - ``in_memory``: it reads an array of its module's (a tensor or numpy array of at least
      :data:`IN_MEMORY_ROWS` elements, ng-video-lecture's ``train_data``): its data is made once
      already, and advice to prepare it is advice to do what it does.

    Empty where the source cannot be read."""
    code = fn.__code__
    node = _function_node(code.co_filename, code.co_firstlineno, code.co_name)
    if node is None:
        return {}
    draws = any(isinstance(n, ast.Call) and ((isinstance(n.func, ast.Attribute) and n.func.attr in _VALUE_DRAWS)
                                             or (isinstance(n.func, ast.Name) and n.func.id in _VALUE_DRAWS))
                for n in ast.walk(node))
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    in_memory = [n for n in sorted(names) if _elements(fn.__globals__.get(n)) >= IN_MEMORY_ROWS]
    return {"name": code.co_name, "draws_values": draws, "in_memory": in_memory}


def _elements(obj) -> int:
    numel = getattr(obj, "numel", None)  # a tensor
    if callable(numel) and type(obj).__module__.startswith("torch"):
        return int(numel())
    size = getattr(obj, "size", None)  # a numpy array
    return int(size) if isinstance(size, int) and type(obj).__module__.startswith("numpy") else 0

