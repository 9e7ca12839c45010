"""What the script's lines that make the batch do, for the input fixes to fit the script (issue 32, item 5).

:func:`line_shape` reads the statement at a sampled line that makes the batch (whether it
builds the batch row by row, what the rows fix would write instead, whether it reads prepared
data already); :func:`function_shape` reads the script's batch function (whether it draws its
values fresh each call, whether it reads an array already in memory). The advice reads them
(:mod:`hasten.profile.per_row`, :mod:`hasten.profile.prepare_once`) so that a fix is never
advice to do what the script does already, nor a change of its data sold as a speed-up.

Changes the training math: no (the source is read, nothing is changed).
"""

from __future__ import annotations

import ast

from hasten.profile.inject.rows_at_once import rows_at_once
from hasten.profile.inject.source_tree import code_node, is_name, statement_at
from hasten.profile.inject.user_code import named


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
    fn = code_node(named(frame).f_code)
    if fn is None:
        return {}
    stmt = statement_at(fn, frame.f_lineno)
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
    return not (isinstance(it, ast.Call) and is_name(it.func, "range"))


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
    node = code_node(code)
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
