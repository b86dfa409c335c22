"""Reading a ``Filter``'s or ``LambdaOp``'s function back from its source: its parameters and the
one expression it returns, found in the parsed file by the lines and columns Python 3.11 records
for its code (several lambdas may share a line).
"""

from __future__ import annotations

import ast
import inspect
import linecache

from merlin_torch_serving.fastpath.errors import NotCompiled


def function_ast(function) -> tuple[list[str], ast.expr]:
    """A function's parameter names and the one expression it returns, from its source."""
    if not inspect.isfunction(function):
        raise NotCompiled(f"{name_of(function)} is not a python function")
    code = function.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        raise NotCompiled(f"{name_of(function)} takes *args, **kwargs or keyword-only arguments")
    node = _definition(function)
    parameters = [argument.arg for argument in node.args.args]
    if isinstance(node, ast.Lambda):
        return parameters, node.body
    body = [
        statement
        for statement in node.body
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        raise NotCompiled(f"{name_of(function)} is more than one `return` of an expression")
    return parameters, body[0].value


def _definition(function) -> ast.Lambda | ast.FunctionDef:
    """The function's own ``lambda`` or ``def`` node in the source of its file."""
    code = function.__code__
    filename = code.co_filename
    lines = linecache.getlines(filename, function.__globals__)
    if not lines:
        raise NotCompiled(f"the source of {name_of(function)} is not available ({filename})")
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        raise NotCompiled(f"the source of {name_of(function)} does not parse") from None
    arguments = list(code.co_varnames[: code.co_argcount])
    span = _body_span(code)
    candidates: list[ast.Lambda | ast.FunctionDef] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and function.__name__ == "<lambda>":
            start = node.lineno
        elif isinstance(node, ast.FunctionDef) and node.name == function.__name__:
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        else:
            continue
        if start != code.co_firstlineno or [a.arg for a in node.args.args] != arguments:
            continue
        candidates.append(node)
    if len(candidates) > 1 and span is not None:
        candidates = [node for node in candidates if _contains(node, span)]
    if len(candidates) != 1:
        raise NotCompiled(
            f"the source of {name_of(function)} cannot be told apart from other functions on"
            f" line {code.co_firstlineno} of {filename}"
        )
    return candidates[0]


def _body_span(code) -> tuple[int, int, int, int] | None:
    """The source span of a code object's instructions (Python 3.11 records their columns)."""
    positions = [p for p in code.co_positions() if None not in p and p[0] >= code.co_firstlineno]
    if not positions:
        return None
    first_line, first_column = min((p[0], p[2]) for p in positions)
    last_line, last_column = max((p[1], p[3]) for p in positions)
    return first_line, first_column, last_line, last_column


def _contains(node: ast.Lambda | ast.FunctionDef, span: tuple[int, int, int, int]) -> bool:
    first_line, first_column, last_line, last_column = span
    return (node.lineno, node.col_offset) <= (first_line, first_column) and (
        node.end_lineno,
        node.end_col_offset,
    ) >= (last_line, last_column)


def name_of(function) -> str:
    """The function's name in messages."""
    return getattr(function, "__qualname__", None) or repr(function)
