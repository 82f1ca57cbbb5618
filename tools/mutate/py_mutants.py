"""The mutation tool's sites in Python source (tools/mutate/mutate.py, docs/mutation.md).

The same operators as for C++, found through Python's own parser (`ast`), so that a
comment, a string or a docstring is never mutated and every mutant parses:

  cmp_flip      == <-> !=, < <-> >, <= <-> >=
  off_by_one    < <-> <=, > <-> >=, and x < n -> x < n - 1, x > n -> x > n + 1
  logic_swap    and <-> or
  assign_drop   &= -> =, |= -> =
  drop_term     a + b -> a, a - b -> a
  swap_args     f(a, b) -> f(b, a) for two simple positional arguments
  negate_cond   if c: -> if not (c):, while c: -> while not (c):
  return_early  `return` inserted before a statement at the top of a function body
  const_shift   an integer n -> n + 1 and n - 1; a float's last written digit + 1
  self_compare  a < b -> a < a

Only the bodies of functions (methods included) are mutated; f-strings are left alone
(their inner positions are not reliable before Python 3.12).
"""

import ast
import re

FLIP = {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Lt: ("<", ">"), ast.Gt: (">", "<"),
        ast.LtE: ("<=", ">="), ast.GtE: (">=", "<=")}
BOUNDARY = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">"}
SIMPLE = (ast.Name, ast.Constant, ast.Attribute)


class Site:
    """One mutant before it gets its id: character span [start, end) replaced by `new`."""

    def __init__(self, op, line, start, end, new, func):
        self.op, self.line, self.start, self.end, self.new, self.func = op, line, start, end, new, func


def _offsets(src):
    """Character offset of (line, UTF-8 byte column), as ast reports positions."""
    lines = src.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def at(lineno, col):
        text = lines[lineno - 1] if lineno - 1 < len(lines) else ""
        return starts[lineno - 1] + len(text.encode()[:col].decode(errors="replace"))

    return at


def _functions(tree):
    """(qualified name, node) of every function and method, outermost first."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, child))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _in_fstring(tree):
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for sub in ast.walk(node):
                inside.add(id(sub))
    return inside


def _shifted(value, text):
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [str(value + 1)] + ([str(value - 1)] if value > 0 else [])
    if isinstance(value, float):
        m = re.match(r"^([0-9_]*\.?[0-9_]*)([eE][+-]?[0-9]+)?$", text)
        if not m or not any(ch.isdigit() for ch in m.group(1)):
            return []
        mant = m.group(1)
        i = max(p for p, ch in enumerate(mant) if ch.isdigit())
        d = "8" if mant[i] == "9" else str(int(mant[i]) + 1)
        return [mant[:i] + d + mant[i + 1:] + (m.group(2) or "")]
    return []


def sites(src, wanted_funcs=None):
    """Every mutant site of the function bodies of `src` (all functions, or those named)."""
    tree = ast.parse(src)
    at = _offsets(src)
    skip = _in_fstring(tree)
    out = []

    def span(node):
        return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)

    def text(node):
        a, b = span(node)
        return src[a:b]

    for fname, fn in _functions(tree):
        if wanted_funcs is not None and fname not in wanted_funcs and fname.split(".")[-1] not in wanted_funcs:
            continue
        nested = {id(n) for name, f in _functions(fn) for n in ast.walk(f)}  # judged under their own name

        def add(op, node, start, end, new):
            out.append(Site(op, node.lineno, start, end, new, fname))

        body = fn.body
        for k, stmt in enumerate(body):
            if k == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):
                continue  # the docstring
            a, _ = span(stmt)
            add("return_early", stmt, a, a, "return\n" + " " * stmt.col_offset)
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if id(node) in skip or id(node) in nested:
                continue
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIP:
                left, right = node.left, node.comparators[0]
                la, lb = span(left)
                ra, rb = span(right)
                gap = src[lb:ra]
                old, flipped = FLIP[type(node.ops[0])]
                p = gap.find(old)
                if p < 0:
                    continue
                add("cmp_flip", node, lb + p, lb + p + len(old), flipped)
                if type(node.ops[0]) in BOUNDARY:
                    add("off_by_one", node, lb + p, lb + p + len(old), BOUNDARY[type(node.ops[0])])
                    add("off_by_one", node, rb, rb,
                        " - 1" if isinstance(node.ops[0], (ast.Lt, ast.LtE)) else " + 1")
                if text(left) != text(right):
                    add("self_compare", node, ra, rb, text(left))
            elif isinstance(node, ast.BoolOp):
                word = "and" if isinstance(node.op, ast.And) else "or"
                other = "or" if word == "and" else "and"
                for x, y in zip(node.values, node.values[1:]):
                    _, xb = span(x)
                    ya, _ = span(y)
                    m = re.search(r"\b" + word + r"\b", src[xb:ya])
                    if m:
                        add("logic_swap", node, xb + m.start(), xb + m.end(), other)
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
                _, tb = span(node.target)
                va, _ = span(node.value)
                m = re.search(r"[&|]=", src[tb:va])
                if m:
                    add("assign_drop", node, tb + m.start(), tb + m.end(), "=")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
                _, lb = span(node.left)
                _, rb = span(node.right)
                if src[lb:rb].lstrip().startswith(("+", "-")):
                    add("drop_term", node, lb, rb, "")
            elif isinstance(node, ast.Call):
                args = node.args
                for x, y in zip(args, args[1:]):
                    if isinstance(x, ast.Starred) or isinstance(y, ast.Starred):
                        continue
                    if not (isinstance(x, SIMPLE) and isinstance(y, SIMPLE)):
                        continue
                    tx, ty = text(x), text(y)
                    if tx == ty or isinstance(x, ast.Constant) != isinstance(y, ast.Constant):
                        continue
                    xa, xb = span(x)
                    ya, yb = span(y)
                    add("swap_args", node, xa, yb, ty + src[xb:ya] + tx)
            elif isinstance(node, (ast.If, ast.While)):
                a, b = span(node.test)
                add("negate_cond", node, a, b, f"not ({src[a:b]})")
            elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
                a, b = span(node)
                for new in _shifted(node.value, src[a:b]):
                    add("const_shift", node, a, b, new)
    return out
