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
batch line. :func:`batch_function` names the script's own function called on those lines
(``get_batch``), the one the batch-function fixes wrap or rewrite
(:mod:`hasten.profile.inject.batch_fn`); what the lines do is read by
:mod:`hasten.profile.inject.batch_shape`; :func:`only_the_call` says when they do nothing else.

The stack sampler (:mod:`hasten.profile.inject.sampler`) counts a sample outside compute
as data only when a frame on the stack is at one of these lines; the rest of that time is
named by its file and line, never called data.

Changes the training math: no (the source is read, nothing is changed).
"""

from __future__ import annotations

import ast
import inspect

from hasten.profile.inject.source_tree import code_node, own_statements, statement_at, statement_lines
from hasten.profile.inject.user_code import is_users

MAX_FRAMES = 3  # callers followed when the batch comes in as a parameter


def batch_lines(frame) -> dict:
    """``{code object: set of line numbers}`` where the batch reaching the model's forward is made.

    ``frame``: any frame inside the forward call (the hook's own); the first frame of the
    user's code above it is the one that called the model. Empty when no source is found."""
    f = _users_frame(frame)
    out: dict = {}
    for _ in range(MAX_FRAMES):
        if f is None:
            break
        fn = code_node(f.f_code)
        if fn is None:
            break
        call = statement_at(fn, f.f_lineno)
        if call is None:
            break
        names = {n for n in _loaded_names(call) if _holds_tensors(f, n)}
        if not names:  # made inline, in the calling statement itself
            out.setdefault(f.f_code, set()).update(statement_lines(call))
            break
        lines, unresolved = _assignments(fn, names, f)
        if lines:
            out.setdefault(f.f_code, set()).update(lines)
        params = _parameters(f.f_code)
        if not (unresolved & params):
            break
        f = _users_frame(f.f_back)
    return out


def _users_frame(frame):
    """The first frame of the user's own code from ``frame`` outwards (None where there is none)."""
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


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
    stmts = [(s, *_binds(s)) for s in own_statements(fn)]
    lines: set[int] = set()
    todo, seen, assigned = set(names), set(), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for node, bound, value in stmts:
            if name not in bound:
                continue
            assigned.add(name)
            lines |= statement_lines(node)
            if value is not None:
                for n in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} - seen - todo:
                    if _holds_tensors(frame, n):
                        todo.add(n)
    return lines, seen - assigned


def _parameters(code) -> set[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    return set(code.co_varnames[:n])


def batch_function(frame, lines: dict):
    """``(namespace, name, function)`` of the user's function that makes the batch: a name called on the
    lines that make it (``X, Y = get_batch('train')``) in the frame that called the model, found in that
    frame's module globals. None where there is none."""
    f = _users_frame(frame)
    if f is None or f.f_code not in lines:
        return None
    fn_node = code_node(f.f_code)
    if fn_node is None:
        return None
    wanted = lines[f.f_code]
    for stmt in own_statements(fn_node):
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


def only_the_call(frame, lines: dict, name: str) -> bool:
    """Whether the lines that make the batch do nothing but call the function ``name`` and bind what it
    returns (``X, Y = get_batch('train')``, its arguments names or constants): then all their time is in
    that function's calls, which are timed (:mod:`hasten.profile.inject.batch_fn`), and the rest of the
    step outside compute is none of it data, however few the stack samples that could say so.

    pytorch/examples' regression/main.py, 0.2 ms a step and a second of steps, left no sample to say
    where that rest went: half of it was called data by default (its weight update by hand and
    ``loss.item()``), 40% of the step where the truth was 18-24% (issue 43)."""
    f = _users_frame(frame)
    if f is None or set(lines) != {f.f_code}:
        return False
    fn_node = code_node(f.f_code)
    if fn_node is None:
        return False
    wanted = lines[f.f_code]
    stmts = [s for s in own_statements(fn_node) if statement_lines(s) & wanted]
    return bool(stmts) and all(_binds_a_call_of(s, name) for s in stmts)


def _binds_a_call_of(stmt, name: str) -> bool:
    if not isinstance(stmt, ast.Assign) or not all(_plain_target(t) for t in stmt.targets):
        return False
    call = stmt.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == name):
        return False
    return all(_plain_value(a) for a in [*call.args, *(k.value for k in call.keywords)])


def _plain_target(node) -> bool:
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_plain_target(t) for t in node.elts)
    return isinstance(node, ast.Name) or isinstance(node, ast.Starred) and isinstance(node.value, ast.Name)


def _plain_value(node) -> bool:
    """A name, a constant or an attribute of a name (``'train'``, ``split``, ``args.batch_size``): no work."""
    if isinstance(node, ast.Starred):
        node = node.value
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, (ast.Name, ast.Constant))
