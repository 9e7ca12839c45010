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
import os
from functools import lru_cache

from hasten.profile.inject.user_code import is_users

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
