"""The user's script read as a syntax tree: the function a frame runs, its own statements,
the statement at a line and the lines a statement spans.

Read by :mod:`~hasten.profile.inject.batch_source` (which lines make the batch),
:mod:`~hasten.profile.inject.batch_shape` (what those lines do) and
:mod:`~hasten.profile.inject.rows_at_once` (the rows fix rewritten into the batch function).
A file is parsed once (:func:`tree` is cached); a file that cannot be read or parsed gives
None, and the callers then find nothing rather than fail.

Changes the training math: no (the source is read, nothing is changed).
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache

# Compound statements: their lines are the header's (``for x, y in batches:``), not the body's.
COMPOUND = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)


@lru_cache(maxsize=32)
def tree(filename: str):
    """The module's syntax tree, or None where the file cannot be read or parsed."""
    try:
        with open(filename, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=os.path.basename(filename))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def function_node(filename: str, firstlineno: int, name: str):
    """The ``def`` (or, for ``<module>``, the module) a code object was compiled from; None where not found."""
    module = tree(filename)
    if module is None:
        return None
    if name == "<module>":
        return module
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if firstlineno in (first, node.lineno):
                return node
    return None


def code_node(code):
    """:func:`function_node` of a code object."""
    return function_node(code.co_filename, code.co_firstlineno, code.co_name)


def own_statements(fn):
    """The statements of a function's body (or a module's), not those of functions or classes defined in it."""
    todo = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.stmt):
            yield node
        todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]


def statement_at(fn, line: int):
    """The innermost simple statement that holds ``line`` (a compound one's header when none does)."""
    best = None
    for node in own_statements(fn):
        end = header_end(node) if isinstance(node, COMPOUND) else (getattr(node, "end_lineno", node.lineno)
                                                                   or node.lineno)
        if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
            best = node
    return best


def header_end(node) -> int:
    """The last line of a compound statement's header."""
    head = {ast.For: "iter", ast.AsyncFor: "iter", ast.While: "test", ast.If: "test"}.get(type(node))
    if head is not None:
        return getattr(node, head).end_lineno
    if isinstance(node, (ast.With, ast.AsyncWith)) and node.items:
        return node.items[-1].context_expr.end_lineno
    return node.lineno


def statement_lines(node) -> set[int]:
    """The lines of a statement (of a compound one, its header)."""
    end = header_end(node) if isinstance(node, COMPOUND) else node.end_lineno
    return set(range(node.lineno, (end or node.lineno) + 1))


def is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
