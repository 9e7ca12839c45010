"""The rows fix: a batch stacked row by row from windows of one array, rewritten as one index of every row.

nanoGPT's ``get_batch`` makes its batch as ``torch.stack([torch.from_numpy(data[i:i+block_size]...)
for i in ix])``: a slice, an array and a tensor per row, in Python. :func:`rows_at_once` writes
that statement as one numpy fancy index of every row (the same rows in the same order, gathered
in C); :func:`rewrite_rows` recompiles the script's batch function with each such statement
rewritten, for a verification run of the fix (:mod:`hasten.profile.inject.batch_fn`), and
:mod:`hasten.profile.inject.batch_shape` offers the rewritten line in the report.

Changes the training math: no (the same rows, in the same order).
"""

from __future__ import annotations

import ast
import copy

from hasten.profile.inject.source_tree import code_node, is_name, tree


def _offset(lower, i: str):
    """``A`` where ``lower`` is ``i + A`` (or ``A + i``), ``0`` where it is ``i``; None otherwise."""
    if is_name(lower, i):
        return 0
    if isinstance(lower, ast.BinOp) and isinstance(lower.op, ast.Add):
        if is_name(lower.left, i):
            return lower.right
        if is_name(lower.right, i):
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
    if not ((isinstance(func, ast.Attribute) and func.attr == "stack") or is_name(func, "stack")):
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
    if len(windows) != 1 or any(is_name(n, i) for n in ast.walk(elt)):
        return None
    return ast.unparse(ast.fix_missing_locations(ast.Assign(targets=stmt.targets, value=elt, lineno=stmt.lineno)))


def rewrite_rows(fn) -> int:
    """Replace ``fn``'s code with its own, each statement :func:`rows_at_once` can rewrite rewritten
    (a verification run of that fix: :mod:`hasten.profile.inject.batch_fn`). The statements rewritten;
    0 and nothing changed where there are none, the source is unreadable, or ``fn`` is a closure (its
    free variables would be read as globals)."""
    code = fn.__code__
    node = code_node(code)
    if node is None or node is tree(code.co_filename) or code.co_freevars:
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
