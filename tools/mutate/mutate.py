#!/usr/bin/env python3
"""A small source-mutation tool for the judge (docs/mutation.md).

No packaged C++ mutation tool exists for this toolchain, so this one works on
tokens: a C++ lexer that knows comments, string/char/raw literals and
preprocessor lines finds the sites, and each operator rewrites one site:

  cmp_flip      == <-> !=, < <-> >, <= <-> >=
  off_by_one    < <-> <=, > <-> >= (boundary), and x < n -> x < n - 1 (bound)
  logic_swap    && <-> ||
  assign_drop   &= -> =, |= -> =
  drop_term     a + b -> a, a - b -> a
  swap_args     f(a, b) -> f(b, a) for two simple arguments of the same kind
  negate_cond   if (c) -> if (!(c)), while (c) -> while (!(c))
  return_early  `return;` / `return {};` inserted before a statement of a function
  const_shift   a constant changed by one: an integer n -> n + 1 and n - 1; a decimal
                fraction's last written digit +1 (0.975 -> 0.976, 1e-3 -> 2e-3)
  self_compare  a value compared with itself: a < b -> a < a (the right operand
                replaced by the left one)

Python files of the scope (python/ced/*.py) get the same operators through
Python's own parser (tools/mutate/py_mutants.py).

Sites are collected over the scope (a committed file: whole files, or named
functions of a file), then a seeded sample of N mutants is drawn spread over
(file, operator) groups. Each mutant is applied in place, built incrementally
in a dedicated build directory, the test stages run (cheap first, stop on the
first failure, per-test timeout), and the source is restored, always (a
journal under the build directory restores it even after a crash).

Subcommands: `list` (print the sample), `run` (the pass), `selftest` (the
tool on a fixture). See docs/mutation.md.
"""

import argparse
import csv
import dataclasses
import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import py_mutants
import reach

OPERATORS = ["cmp_flip", "off_by_one", "logic_swap", "assign_drop", "drop_term", "swap_args",
             "negate_cond", "return_early", "const_shift", "self_compare"]

# ---------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------

PUNCTS = sorted("""<<= >>= <=> ->* ... :: -> ++ -- << >> <= >= == != && || += -= *= /= %= &= |= ^= .*
{ } [ ] ( ) ; : , . ? ~ ! + - * / % ^ & | = < > #""".split(), key=len, reverse=True)


@dataclasses.dataclass
class Tok:
    kind: str   # id, num, punct, str, chr
    text: str
    start: int
    end: int
    line: int


class LexError(Exception):
    pass


def lex(src):
    """Tokens of C++ source, without comments and preprocessor lines."""
    toks = []
    i, n, line = 0, len(src), 1
    at_line_start = True
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its continuations: never mutated.
            while i < n and src[i] != "\n":
                if src[i] == "\\" and i + 1 < n and src[i + 1] == "\n":
                    line += 1
                    i += 2
                    continue
                if src.startswith("/*", i):
                    j = src.find("*/", i + 2)
                    j = n if j < 0 else j + 2
                    line += src.count("\n", i, j)
                    i = j
                    continue
                if src.startswith("//", i):
                    while i < n and src[i] != "\n":
                        i += 1
                    break
                i += 1
            continue
        at_line_start = False
        if src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise LexError(f"line {line}: unterminated comment")
            line += src.count("\n", i, j + 2)
            i = j + 2
            continue
        m = re.match(r'(u8|u|U|L)?R"([^ ()\\\t\n]{0,16})\(', src[i:i + 40])
        if m:
            close = ")" + m.group(2) + '"'
            j = src.find(close, i + m.end())
            if j < 0:
                raise LexError(f"line {line}: unterminated raw string")
            j += len(close)
            toks.append(Tok("str", src[i:j], i, j, line))
            line += src.count("\n", i, j)
            i = j
            continue
        m = re.match(r'(u8|u|U|L)?(["\'])', src[i:i + 3])
        if m and (m.start(2) == 0 or not (src[i].isalnum() and m.group(1) is None)):
            q = m.group(2)
            j = i + m.end()
            while j < n and src[j] != q:
                if src[j] == "\\":
                    j += 1
                if j < n and src[j] == "\n":
                    raise LexError(f"line {line}: newline in literal")
                j += 1
            if j >= n:
                raise LexError(f"line {line}: unterminated literal")
            j += 1
            toks.append(Tok("str" if q == '"' else "chr", src[i:j], i, j, line))
            i = j
            continue
        if c.isalpha() or c == "_":
            j = i + 1
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            toks.append(Tok("id", src[i:j], i, j, line))
            i = j
            continue
        if c.isdigit() or (c == "." and i + 1 < n and src[i + 1].isdigit()):
            j = i + 1
            while j < n:
                if src[j] in "eEpP" and j + 1 < n and src[j + 1] in "+-":
                    j += 2
                elif src[j].isalnum() or src[j] in "._":
                    j += 1
                elif src[j] == "'" and j + 1 < n and src[j + 1].isalnum():
                    j += 1  # digit separator
                else:
                    break
            toks.append(Tok("num", src[i:j], i, j, line))
            i = j
            continue
        for p in PUNCTS:
            if src.startswith(p, i):
                toks.append(Tok("punct", p, i, i + len(p), line))
                i += len(p)
                break
        else:
            raise LexError(f"line {line}: unexpected character {c!r}")
    return toks


# ---------------------------------------------------------------------------
# Structure: brackets, function bodies
# ---------------------------------------------------------------------------

OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = {")", "]", "}"}


def match_brackets(toks):
    """Index of the partner of every bracket token (angle brackets excluded)."""
    partner = {}
    stack = []
    for k, t in enumerate(toks):
        if t.kind != "punct":
            continue
        if t.text in OPEN:
            stack.append(k)
        elif t.text in CLOSE:
            if not stack:
                raise LexError(f"line {t.line}: unbalanced {t.text}")
            o = stack.pop()
            if OPEN[toks[o].text] != t.text:
                raise LexError(f"line {t.line}: {toks[o].text} closed by {t.text}")
            partner[o] = k
            partner[k] = o
    if stack:
        raise LexError(f"line {toks[stack[-1]].line}: unclosed {toks[stack[-1]].text}")
    return partner


@dataclasses.dataclass
class Func:
    name: str        # as written, qualified names joined ("ReplayPolicy::parse")
    open: int        # token index of the body's {
    close: int       # token index of the body's }
    void: bool       # return; rather than return {};


SPECIFIERS = {"const", "noexcept", "override", "final", "mutable", "volatile", "&", "&&"}
DECL_NOISE = {"static", "inline", "constexpr", "consteval", "virtual", "explicit", "extern", "friend",
              "[[nodiscard]]"}


def find_functions(toks, partner):
    """Function definitions at namespace or class scope, with their bodies."""
    funcs = []

    def scan(lo, hi):  # tokens lo..hi-1 are at namespace or class scope
        k = lo
        stmt = lo
        while k < hi:
            t = toks[k]
            if t.kind == "punct" and t.text in (";", "}"):
                stmt = k + 1
                k += 1
                continue
            if t.kind == "punct" and t.text in ("(", "["):
                k = partner[k] + 1
                continue
            if t.kind == "punct" and t.text == "{":
                close = partner[k]
                head = [x.text for x in toks[stmt:k]]
                if "namespace" in head or (head and head[0] in ("extern",) and len(head) == 2):
                    scan(k + 1, close)
                elif any(h in ("struct", "class", "union") for h in head) and "(" not in head:
                    scan(k + 1, close)
                else:
                    f = function_at(stmt, k, close)
                    if f:
                        funcs.append(f)
                # a brace initializer or an enum body: nothing to scan
                k = close + 1
                if k < hi and toks[k].text == ";":
                    k += 1
                stmt = k
                continue
            k += 1

    def function_at(stmt, brace, close):
        j = brace - 1
        while j > stmt and toks[j].text in SPECIFIERS:
            j -= 1
        if toks[j].text != ")":
            # trailing return type: `) -> T {`
            arrow = [m for m in range(stmt, brace) if toks[m].text == "->"]
            if not arrow:
                return None
            j = arrow[-1] - 1
            while j > stmt and toks[j].text in SPECIFIERS:
                j -= 1
            if toks[j].text != ")":
                return None
        po = partner[j]
        name_end = po
        m = po - 1
        if m < stmt or toks[m].kind != "id":
            return None
        parts = [toks[m].text]
        while m - 2 >= stmt and toks[m - 1].text == "::" and toks[m - 2].kind == "id":
            parts.insert(0, toks[m - 2].text)
            m -= 2
        if m - 1 >= stmt and toks[m - 1].text == "operator":
            return None
        ret = [x.text for x in toks[stmt:m] if x.text not in DECL_NOISE]
        # drop a template header
        if ret and ret[0] == "template":
            depth, q = 0, 0
            for q, x in enumerate(ret):
                if x == "<":
                    depth += 1
                elif x == ">":
                    depth -= 1
                    if depth == 0:
                        break
            ret = ret[q + 1:]
        void = ret in ([], ["void"]) or parts[-1].startswith("~") or (len(parts) >= 2 and parts[-1] == parts[-2])
        del name_end
        return Func("::".join(parts), brace, close, void)

    scan(0, len(toks))
    return funcs


# ---------------------------------------------------------------------------
# Mutants
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Mutant:
    file: str        # path relative to the source root
    op: str
    line: int
    start: int       # character span replaced
    end: int
    new: str
    func: str
    id: str = ""
    before: str = ""  # the source line before and after, for the table
    after: str = ""


CMP = {"==", "!=", "<", ">", "<=", ">="}
FLIP = {"==": "!=", "!=": "==", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
OPERAND_END = {"id", "num", "str", "chr"}
STOP_EXPR = {")", "]", "}", ";", ",", "?", ":", "&&", "||", "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
             "<<=", ">>=", "==", "!=", "<=", ">=", "<=>"}
NOT_CALLS = {"if", "while", "for", "switch", "return", "sizeof", "alignof", "decltype", "catch", "static_assert",
             "noexcept", "alignas", "typeid", "co_return", "throw", "requires", "operator"}


def spaced(src, t):
    return t.start > 0 and src[t.start - 1] in " \t\n" and t.end < len(src) and src[t.end] in " \t\n"


def is_comparison(src, toks, k):
    t = toks[k]
    if t.kind != "punct" or t.text not in CMP:
        return False
    if k > 0 and toks[k - 1].text == "operator":
        return False
    if t.text in ("<", ">"):
        return spaced(src, t)  # `a < b`; template brackets are written without spaces
    return True


def expr_end(src, toks, partner, k, stop_at_additive=False):
    """Index one past the expression that starts at token k (to the next operator of lower precedence)."""
    j = k
    # leading unary operators
    while j < len(toks) and toks[j].text in ("-", "+", "!", "~", "*", "&") and not spaced(src, toks[j]):
        j += 1
    angle = 0
    while j < len(toks):
        t = toks[j]
        if t.kind == "punct":
            if t.text in OPEN:
                j = partner[j] + 1
                continue
            if t.text in CLOSE and angle == 0:
                break
            if t.text == "<" and not spaced(src, t) and j > 0 and toks[j - 1].kind == "id":
                angle += 1
                j += 1
                continue
            if t.text in (">", ">>") and angle > 0 and not spaced(src, t):
                angle = max(0, angle - len(t.text))
                j += 1
                continue
            if angle == 0:
                if t.text in STOP_EXPR:
                    break
                if t.text in ("<", ">") and spaced(src, t):
                    break
                if t.text in ("&", "|", "^", "<<", ">>") and spaced(src, t):
                    break
                if stop_at_additive and t.text in ("+", "-") and spaced(src, t):
                    break
        j += 1
    return j


# What may stand before the left operand of a comparison that self_compare copies: nothing that
# binds tighter than the comparison (`a + b < c` would copy `b` alone).
LEFT_OPEN = {"(", "&&", "||", ",", "=", "?", ":", ";", "{", "}", "return", "!"}


def left_operand(src, toks, partner, k):
    """Index of the first token of the comparison's left operand at k (a name, a number, a member or
    call chain such as `a.b->c(x)[i]`), or None when it is not one of those."""
    j = k - 1
    while j >= 0:
        t = toks[j]
        if t.text in (")", "]"):
            j = partner[j]
            if j > 0 and toks[j - 1].kind == "id" and toks[j - 1].text not in NOT_CALLS:
                j -= 1
            elif toks[j].text == "[" or (j > 0 and toks[j - 1].text not in LEFT_OPEN):
                return None
        elif t.kind not in ("id", "num") or t.text in NOT_CALLS:
            return None
        if j >= 2 and toks[j - 1].text in (".", "->", "::"):
            j -= 2
            continue
        break
    if j < 0 or (j > 0 and toks[j - 1].text not in LEFT_OPEN):
        return None
    return j


INT_LITERAL = re.compile(r"^(0[xX][0-9a-fA-F']+|[0-9][0-9']*)([uUlLzZ]*)$")
FLOAT_LITERAL = re.compile(r"^([0-9]*\.?[0-9]*)([eE][+-]?[0-9]+)?([fFlL]?)$")


def shifted_constants(text):
    """A numeric literal changed by one: an integer n -> n + 1 and n - 1 (not below 0), a decimal
    fraction's last written mantissa digit + 1 (9 -> 8)."""
    m = INT_LITERAL.match(text)
    if m:
        digits = m.group(1).replace("'", "")
        v = int(digits, 16) if digits[:2] in ("0x", "0X") else int(digits, 8) if len(digits) > 1 and digits[0] == "0" \
            else int(digits)
        out = [v + 1] + ([v - 1] if v > 0 else [])
        hexa = digits[:2] in ("0x", "0X")
        return [(hex(x) if hexa else str(x)) + m.group(2) for x in out]
    m = FLOAT_LITERAL.match(text)
    if m and any(ch.isdigit() for ch in m.group(1)):
        mant = m.group(1)
        i = max(p for p, ch in enumerate(mant) if ch.isdigit())
        d = "8" if mant[i] == "9" else str(int(mant[i]) + 1)
        return [mant[:i] + d + mant[i + 1:] + (m.group(2) or "") + m.group(3)]
    return []


SIMPLE_ARG = re.compile(r"^-?(?:[A-Za-z_]\w*(?:(?:\.|->|::)[A-Za-z_]\w*)*|\d[\w.']*)$")


def split_args(toks, partner, po):
    pc = partner[po]
    args, cur = [], []
    k = po + 1
    while k < pc:
        t = toks[k]
        if t.text in OPEN:
            cur.extend(range(k, partner[k] + 1))
            k = partner[k] + 1
            continue
        if t.text == ",":
            args.append(cur)
            cur = []
        else:
            cur.append(k)
        k += 1
    if cur:
        args.append(cur)
    return args


def collect(src, toks, partner, funcs, rel, wanted_funcs):
    """Every mutant of every operator over the function bodies in scope."""
    out = []
    line_of = lambda k: toks[k].line  # noqa: E731

    def body_of(k):
        for f in funcs:
            if f.open < k < f.close:
                return f
        return None

    def in_scope(f):
        return f is not None and (wanted_funcs is None or f.name in wanted_funcs
                                  or f.name.split("::")[-1] in wanted_funcs)

    def add(op, k, start, end, new):
        f = body_of(k)
        if in_scope(f):
            out.append(Mutant(rel, op, line_of(k), start, end, new, f.name))

    for k, t in enumerate(toks):
        if is_comparison(src, toks, k):
            add("cmp_flip", k, t.start, t.end, FLIP[t.text])
            if t.text in BOUNDARY:
                add("off_by_one", k, t.start, t.end, BOUNDARY[t.text])
                e = expr_end(src, toks, partner, k + 1)
                if e > k + 1:
                    last = toks[e - 1]
                    add("off_by_one", k, last.end, last.end, " - 1" if t.text in ("<", "<=") else " + 1")
        if is_comparison(src, toks, k):
            lo = left_operand(src, toks, partner, k)
            e = expr_end(src, toks, partner, k + 1)
            if lo is not None and e > k + 1:
                left = src[toks[lo].start:toks[k - 1].end]
                right = src[toks[k + 1].start:toks[e - 1].end]
                if left != right:
                    add("self_compare", k, toks[k + 1].start, toks[e - 1].end, left)
        if t.kind == "num":
            for new in shifted_constants(t.text):
                add("const_shift", k, t.start, t.end, new)
        if t.kind == "punct" and t.text in ("&&", "||") and spaced(src, t):
            add("logic_swap", k, t.start, t.end, "||" if t.text == "&&" else "&&")
        if t.kind == "punct" and t.text in ("&=", "|="):
            add("assign_drop", k, t.start, t.end, "=")
        if (t.kind == "punct" and t.text in ("+", "-") and spaced(src, t) and k > 0
                and (toks[k - 1].kind in OPERAND_END or toks[k - 1].text in (")", "]"))):
            e = expr_end(src, toks, partner, k + 1, stop_at_additive=True)
            if e > k + 1:
                add("drop_term", k, toks[k - 1].end, toks[e - 1].end, "")
        if (t.kind == "punct" and t.text == "(" and k > 0 and toks[k - 1].kind == "id"
                and toks[k - 1].text not in NOT_CALLS):
            args = split_args(toks, partner, k)
            texts = ["".join(src[toks[a].start:toks[a].end] for a in arg) for arg in args]
            for a in range(len(args) - 1):
                x, y = texts[a], texts[a + 1]
                if not (SIMPLE_ARG.match(x) and SIMPLE_ARG.match(y)) or x == y:
                    continue
                if x.lstrip("-")[0].isdigit() != y.lstrip("-")[0].isdigit():
                    continue  # a number and a name: rarely the same type
                s0, e0 = toks[args[a][0]].start, toks[args[a][-1]].end
                s1, e1 = toks[args[a + 1][0]].start, toks[args[a + 1][-1]].end
                add("swap_args", k, s0, e1, y + src[e0:s1] + x)
        if (t.kind == "id" and t.text in ("if", "while") and k + 1 < len(toks) and toks[k + 1].text == "("
                and not (k > 0 and toks[k - 1].text == "}" and t.text == "while")):
            po = k + 1
            pc = partner[po]
            inner = src[toks[po + 1].start:toks[pc - 1].end]
            if ";" in [toks[m].text for m in range(po + 1, pc)]:
                continue  # if (init; cond): leave it
            add("negate_cond", k, toks[po].start, toks[pc].end, f"(!({inner}))")

    # return_early: before each statement at the top level of a function body
    for f in funcs:
        if not in_scope(f):
            continue
        ret = "return; " if f.void else "return {}; "
        k = f.open + 1
        starts = []
        while k < f.close:
            starts.append(k)
            # advance to the end of this statement
            while k < f.close:
                t = toks[k]
                if t.text in ("(", "["):
                    k = partner[k] + 1
                    continue
                if t.text == "{":
                    k = partner[k] + 1
                    if k < f.close and toks[k].text in ("else", "catch", "while", ";", ",", ")", "."):
                        continue
                    if toks[k - 1 - 0].text == "}" and k < f.close and toks[k].kind in ("id",) and \
                            toks[k].text in ("else", "catch"):
                        continue
                    break
                if t.text == ";":
                    k += 1
                    break
                k += 1
        for s in starts:
            tok = toks[s]
            if tok.text in ("case", "default", "else", "catch"):
                continue
            out.append(Mutant(rel, "return_early", tok.line, tok.start, tok.start, ret, f.name))
    return out


def line_text(src, pos):
    a = src.rfind("\n", 0, pos) + 1
    b = src.find("\n", pos)
    return src[a:b if b >= 0 else len(src)]


def finish(src, m, seen):
    m.before = line_text(src, m.start).strip()
    mutated = src[:m.start] + m.new + src[m.end:]
    m.after = line_text(mutated, m.start).strip()
    key = f"{m.file}|{m.op}|{m.func}|{m.before}|{m.after}"
    n = seen.get(key, 0)
    seen[key] = n + 1
    m.id = hashlib.sha1(f"{key}|{n}".encode()).hexdigest()[:10]


def mutants_of_file(root, rel, wanted_funcs):
    src = (root / rel).read_text()
    if rel.endswith(".py"):
        ms = [Mutant(rel, x.op, x.line, x.start, x.end, x.new, x.func) for x in py_mutants.sites(src, wanted_funcs)]
    else:
        toks = lex(src)
        partner = match_brackets(toks)
        funcs = find_functions(toks, partner)
        ms = collect(src, toks, partner, funcs, rel, wanted_funcs)
    ms.sort(key=lambda m: (m.start, m.end, m.op, m.new))
    seen = {}
    for m in ms:
        finish(src, m, seen)
    return ms


def read_scope(root, scope_file):
    """Lines `path` (a file, or a directory's *.cpp and *.py, tests excluded) or `path: f1, f2` (named
    functions only)."""
    entries = []
    for raw in Path(scope_file).read_text().splitlines():
        s = raw.split("#", 1)[0].strip()
        if not s:
            continue
        path, _, funcs = s.partition(":")
        path = path.strip()
        wanted = {x.strip() for x in funcs.split(",") if x.strip()} or None
        p = root / path
        if p.is_dir():
            for f in sorted([*p.glob("*.cpp"), *p.glob("*.py")]):
                if f.name.endswith("_test.cpp") or f.name.startswith("test_") or f.name == "conftest.py":
                    continue  # the tests themselves are not the judge
                entries.append((str(f.relative_to(root)), wanted))
        elif p.is_file():
            entries.append((path, wanted))
        else:
            raise SystemExit(f"mutate: scope entry {path!r} does not exist under {root}")
    return entries


def all_mutants(root, scope_file):
    out = []
    for rel, wanted in read_scope(root, scope_file):
        out.extend(mutants_of_file(root, rel, wanted))
    return out


def sample(mutants, n, seed):
    """N mutants spread over (file, operator) groups, round-robin, deterministic in the seed."""
    rng = random.Random(seed)
    groups = {}
    for m in mutants:
        groups.setdefault((m.file, m.op), []).append(m)
    keys = sorted(groups)
    for k in keys:
        rng.shuffle(groups[k])
    rng.shuffle(keys)
    chosen = []
    while len(chosen) < n and any(groups[k] for k in keys):
        for k in keys:
            if groups[k] and len(chosen) < n:
                chosen.append(groups[k].pop())
    return chosen


# ---------------------------------------------------------------------------
# Applying and restoring
# ---------------------------------------------------------------------------

class Journal:
    """The original of the file being mutated, kept until it is restored."""

    def __init__(self, root, work):
        self.root = root
        self.path = work / "restore.json"

    def recover(self):
        if self.path.exists():
            j = json.loads(self.path.read_text())
            (self.root / j["file"]).write_text(j["original"])
            self.path.unlink()
            print(f"mutate: restored {j['file']} from an interrupted run", file=sys.stderr)

    def apply(self, m):
        p = self.root / m.file
        original = p.read_text()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"file": m.file, "original": original}))
        os.replace(tmp, self.path)
        p.write_text(original[:m.start] + m.new + original[m.end:])
        return original

    def restore(self, m, original):
        (self.root / m.file).write_text(original)
        self.path.unlink(missing_ok=True)


def read_equivalent(path):
    eq = {}
    if path and Path(path).exists():
        for raw in Path(path).read_text().splitlines():
            s = raw.strip()
            if not s or s.startswith("#"):
                continue
            fields = [x.strip() for x in s.split("|")]
            if len(fields) < 3 or not fields[2]:
                raise SystemExit(f"mutate: {path}: `id | where | why` expected, got: {s}")
            eq[fields[0]] = fields[2]
    return eq


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------

def run_cmd(cmd, cwd, timeout):
    """Runs a shell command in its own process group; on a timeout or an interrupt the whole group goes."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out, time.monotonic() - t0, False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return -1, out or "", time.monotonic() - t0, True
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise


FAILED_RE = re.compile(r"^\s*\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|[^)]*)\)",
                       re.M)


PYTEST_FAILED_RE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


# The libraries the Python package's module links (python/CMakeLists.txt); a mutant of any binary
# these load reaches the package.
PACKAGE_LIBRARIES = ["libced_golden.so", "libced_backends.so", "libced_io.so", "libced_compare.so", "libced_model.so"]


def test_stages(args, file=None):
    """The stages that judge a mutant of `file` (None: every stage, the baseline), as (command, folder).
    The Python package's own files (python/) are judged by its pytest suite; the C++ libraries by CTest,
    then by pytest over the package rebuilt from them (the package links them); the `ced` commands
    (tools/) by CTest alone, since the package does not contain them."""
    if args.test_cmd:
        return [(args.test_cmd, args.build)]
    reach = getattr(args, "reach", None)
    binaries = None
    if reach is not None and file is not None and not file.endswith(".py"):
        binaries = reach.binaries_of(file) or None  # None: not found in this build, so every test runs
    ctest = []
    for s, names in zip(args.stage, getattr(args, "stage_names", [None] * len(args.stage))):
        if reach is None or names is None or binaries is None:
            ctest.append((f"ctest {s} {args.ctest_args} --timeout {args.test_timeout}", args.build))
            continue
        seen = [reach.number[n] for n in names if reach.sees(n, binaries)]
        if seen:  # CTest runs exactly the tests whose numbers follow 0,0,0 (no range)
            ctest.append((f"ctest -I 0,0,0,{','.join(map(str, seen))} {args.ctest_args} "
                          f"--timeout {args.test_timeout}", args.build))
    python = [(args.python_cmd, args.src)] if args.python_cmd else []
    if file is None:
        return ctest + python
    if file.startswith("python/"):
        return python
    if file.endswith(".py") or file.startswith("tools/"):
        return ctest  # the package does not contain the `ced` commands or the scripts
    if binaries is not None and reach is not None and not (binaries & args.package_binaries):
        return ctest
    if args.python_for_package_only:
        return ctest  # a library's mutant judged by CTest alone (a narrower, cheaper pass; the rate a lower bound)
    return ctest + python


def run_tests(args, file=None):
    """Run the stages in order; the first failing test kills the mutant."""
    total = 0.0
    for cmd, cwd in test_stages(args, file):
        rc, out, dt, hung = run_cmd(cmd, cwd, args.stage_timeout)
        total += dt
        if hung:
            return "timeout", f"stage `{cmd}` ran past {args.stage_timeout}s", total
        if rc != 0:
            m = FAILED_RE.search(out)
            if m:
                status = "timeout" if "Timeout" in m.group(2) else "killed"
                return status, m.group(1), total
            m = PYTEST_FAILED_RE.search(out)
            if m:
                return "killed", m.group(1), total
            if "No tests were found" in out or "no tests ran" in out:
                raise SystemExit(f"mutate: `{cmd}` found no tests")
            return "killed", f"`{cmd}` exit {rc}", total
    return "survived", "", total


def cmd_run(args):
    root = Path(args.src).resolve()
    build = Path(args.build).resolve()
    work = build / "mutation"
    work.mkdir(parents=True, exist_ok=True)
    journal = Journal(root, work)
    journal.recover()
    eq = read_equivalent(args.equivalent)
    if args.only:
        # By id from every site, not from the sample: a sample's survivors run again on a later commit
        # (their tests added), where new sites have moved the seeded draw. An id the source no longer
        # has (its line rewritten) is named, not passed over.
        wanted = [i for i in args.only.split(",") if i]
        ms = [m for m in all_mutants(root, args.scope) if m.id in set(wanted)]
        gone = sorted(set(wanted) - {m.id for m in ms})
        if gone:
            print(f"mutate: not in this source (its line changed): {', '.join(gone)}", flush=True)
    else:
        ms = sample(all_mutants(root, args.scope), args.count, args.seed)
    # Consecutive mutants of one file recompile that file once each; the files come in a seeded order,
    # so that an interrupted pass has covered a random subset of the files, not the first directories.
    files = sorted({m.file for m in ms})
    random.Random(args.seed).shuffle(files)
    rank = {f: i for i, f in enumerate(files)}
    ms.sort(key=lambda m: (rank[m.file], m.start, m.op, m.new))
    build_cmd = args.build_cmd or f"cmake --build {shlex.quote(str(build))} {args.build_args}"

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    # A shell without job control starts background commands with SIGINT ignored; take it back.
    signal.signal(signal.SIGINT, interrupted)
    print(f"mutate: {len(ms)} mutants, seed {args.seed}, src {root}, build {build}", flush=True)
    # The first build of the unmutated tree may rebuild everything: it has no time limit (the
    # per-mutant limit, --build-timeout, once made a loaded machine's full rebuild look like a failure).
    rc, out, dt, _ = run_cmd(build_cmd, root, None)
    if rc != 0:
        raise SystemExit(f"mutate: the unmutated tree does not build (exit {rc}):\n{out[-3000:]}")
    if not args.test_cmd and not args.every_test:
        # Which tests can see which mutant (tools/mutate/reach.py): a test that loads none of the
        # mutated binaries gives the same verdict with and without the mutant, and is skipped.
        args.reach = reach.Reach(build)
        args.stage_names = [args.reach.stage_names(s) for s in args.stage]
        args.package_binaries = args.reach.closure(PACKAGE_LIBRARIES)  # once: a walk of the whole build
    if not args.no_baseline:
        status, why, dt = run_tests(args)
        if status != "survived":
            raise SystemExit(f"mutate: the unmutated tree fails its tests ({why})")
        print(f"mutate: baseline tests pass in {dt:.0f}s", flush=True)
    rows = []
    t_start = time.monotonic()
    try:
        for i, m in enumerate(ms):
            row = dataclasses.asdict(m)
            if m.id in eq:
                row.update(status="equivalent", detail=eq[m.id], build_s=0.0, test_s=0.0)
            else:
                original = journal.apply(m)
                try:
                    rc, out, bdt, hung = run_cmd(build_cmd, root, args.build_timeout)
                    if rc != 0 or hung:
                        err = next((ln for ln in out.splitlines() if "error" in ln), "build failed")
                        err = err.replace(str(root) + os.sep, "")  # relative paths: the table is committed
                        row.update(status="stillborn", detail=err.strip()[:200], build_s=bdt, test_s=0.0)
                    else:
                        status, why, tdt = run_tests(args, m.file)
                        row.update(status=status, detail=why, build_s=bdt, test_s=tdt)
                finally:
                    journal.restore(m, original)
            rows.append(row)
            print(f"[{i + 1}/{len(ms)}] {m.id} {m.file}:{m.line} {m.op}: {row['status']} "
                  f"{row['detail'][:80]} ({row['build_s']:.0f}s build, {row['test_s']:.0f}s tests)", flush=True)
            write_tables(args, rows, time.monotonic() - t_start, len(ms))
    except KeyboardInterrupt:
        print("mutate: interrupted; the source is restored", file=sys.stderr)
        write_tables(args, rows, time.monotonic() - t_start, len(ms))
        return 130
    finally:
        # Bring the build back to the unmutated source.
        run_cmd(build_cmd, root, args.build_timeout)
    s = summary(rows)
    return 0 if s["rate"] is None or s["rate"] >= args.target else 1


def summary(rows):
    c = {k: sum(1 for r in rows if r["status"] == k)
         for k in ("stillborn", "killed", "timeout", "equivalent", "survived")}
    judged = c["killed"] + c["timeout"] + c["survived"]
    c["generated"] = len(rows)
    c["rate"] = (c["killed"] + c["timeout"]) / judged if judged else None
    return c


def write_tables(args, rows, elapsed, planned):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["id", "file", "line", "func", "op", "status", "detail", "build_s", "test_s", "before", "after"]
    tmp = out / "kill-table.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.1f}" if isinstance(r[k], float) else r[k]) for k in fields})
    os.replace(tmp, out / "kill-table.csv")
    s = summary(rows)
    ran = [r for r in rows if r["status"] != "equivalent"]
    per = sum(r["build_s"] + r["test_s"] for r in ran) / len(ran) if ran else 0.0
    lines = [
        "# Mutation pass", "",
        f"Seed {args.seed}, {len(rows)} of {planned} mutants done"
        + (f", wall {elapsed / 60:.1f} min" if elapsed == elapsed else "")
        + f", {per:.0f} s per mutant run (build + tests).", "",
        "| generated | stillborn | killed | timeout | equivalent | survived | kill rate (non-equivalent) |",
        "|---|---|---|---|---|---|---|",
        f"| {s['generated']} | {s['stillborn']} | {s['killed']} | {s['timeout']} | {s['equivalent']} | "
        f"{s['survived']} | " + (f"{100 * s['rate']:.1f} %" if s["rate"] is not None else "n/a") + " |", "",
        "Kill rate = (killed + timeout) / (generated - stillborn - equivalent).", "",
        "## By operator", "", "| operator | generated | stillborn | killed+timeout | equivalent | survived |",
        "|---|---|---|---|---|---|"]
    for op in OPERATORS:
        rs = [r for r in rows if r["op"] == op]
        if rs:
            t = summary(rs)
            lines.append(f"| {op} | {t['generated']} | {t['stillborn']} | {t['killed'] + t['timeout']} | "
                         f"{t['equivalent']} | {t['survived']} |")
    lines += ["", "## Survivors", ""]
    surv = [r for r in rows if r["status"] == "survived"]
    if not surv:
        lines.append("None.")
    for r in surv:
        lines.append(f"- `{r['id']}` {r['file']}:{r['line']} ({r['func']}, {r['op']}): "
                     f"`{r['before']}` -> `{r['after']}`")
    tmp = out / "kill-table.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out / "kill-table.md")


def cmd_list(args):
    root = Path(args.src).resolve()
    allm = all_mutants(root, args.scope)
    ms = sample(allm, args.count, args.seed) if args.count else allm
    for m in ms:
        print(f"{m.id} {m.file}:{m.line} {m.func} {m.op}\n    - {m.before}\n    + {m.after}")
    by = {}
    for m in allm:
        by[m.op] = by.get(m.op, 0) + 1
    print(f"# {len(ms)} listed of {len(allm)} sites: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())),
          file=sys.stderr)
    return 0


def cmd_table(args):
    """Merges kill tables (a later row of a mutant replaces an earlier one, e.g. a rerun with new tests)
    and applies the declared equivalents."""
    eq = read_equivalent(args.equivalent)
    rows = {}
    for path in args.csv:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                for k in ("build_s", "test_s"):
                    r[k] = float(r[k])
                r["line"] = int(r["line"])
                if r["status"] == "stillborn" and r["id"] in rows:
                    continue  # a rerun that did not build says nothing new
                rows[r["id"]] = r
    for r in rows.values():
        if r["id"] in eq and r["status"] == "survived":
            r.update(status="equivalent", detail=eq[r["id"]])
    args.seed = args.seed if args.seed is not None else "?"
    out = list(rows.values())
    write_tables(args, out, float("nan"), len(out))
    s = summary(out)
    return 0 if s["rate"] is None or s["rate"] >= args.target else 1


# ---------------------------------------------------------------------------
# Self test: the tool on a fixture
# ---------------------------------------------------------------------------

def cmd_selftest(args):
    failures, counts = [], []
    for fixture in (args.fixture, args.py_fixture):
        n_ms, n_ops, n_expected = selftest_fixture(Path(fixture).resolve(), args.compile, failures)
        counts.append(f"{Path(fixture).name}: {n_ms} mutants over {n_ops} operators, {n_expected} expected")
    for f in failures:
        print("FAIL:", f)
    print(f"selftest: {'; '.join(counts)}; {len(failures)} failures")
    return 1 if failures else 0


def selftest_fixture(fixture, compile_each, failures):
    """The tool on one fixture (C++ or Python): its expected mutants, nothing mutated where a line says
    NOT_MUTATED, every mutant a change that compiles (parses), restored to the same bytes."""
    python = fixture.suffix == ".py"
    marker = "EXPECT:" if python else "// EXPECT:"
    expected = [ln.split("EXPECT:", 1)[1].strip() for ln in fixture.read_text().splitlines()
                if ln.lstrip().startswith(marker)]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        rel = fixture.name
        original = fixture.read_text()
        (root / rel).write_text(original)
        ms = mutants_of_file(root, rel, None)
        ops = {m.op for m in ms}
        for op in OPERATORS:
            if op not in ops:
                failures.append(f"{rel}: operator {op} produced no mutant")
        for m in ms:
            # return_early inserts before a statement: allowed anywhere a statement starts.
            if "NOT_MUTATED" in line_text(original, m.start) and m.op != "return_early":
                failures.append(f"{rel}: {m.op} mutated a comment, literal or preprocessor line: {m.before!r}")
        for e in expected:
            op, _, after = e.partition(" ")
            if not any(m.op == op and m.after == after for m in ms):
                failures.append(f"{rel}: expected mutant missing: {op} -> {after!r}")
        ids = [m.id for m in ms]
        if len(set(ids)) != len(ids):
            failures.append(f"{rel}: mutant ids are not unique")
        if [m.id for m in sample(ms, 10, 7)] != [m.id for m in sample(ms, 10, 7)]:
            failures.append(f"{rel}: sampling is not deterministic in the seed")
        cxx = os.environ.get("CXX", "c++")
        journal = Journal(root, root)
        for m in ms:
            saved = journal.apply(m)
            try:
                mutated = (root / rel).read_text()
                if mutated == original:
                    failures.append(f"{rel}: {m.op} at line {m.line} changed nothing")
                if python:
                    try:
                        compile(mutated, rel, "exec")
                    except SyntaxError as e:
                        failures.append(f"{rel}: {m.op} at line {m.line} does not parse: {m.after!r} ({e})")
                elif compile_each:
                    p = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-x", "c++", str(root / rel)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    if p.returncode != 0 and m.op != "swap_args":
                        failures.append(f"{rel}: {m.op} at line {m.line} does not compile: {m.after!r}\n"
                                        f"{p.stdout[:500]}")
            finally:
                journal.restore(m, saved)
            if (root / rel).read_text() != original or journal.path.exists():
                failures.append(f"{rel}: restore after {m.op} at line {m.line} did not give the original back")
        # An interrupted run is recovered from the journal.
        journal.apply(ms[0])
        Journal(root, root).recover()
        if (root / rel).read_text() != original:
            failures.append(f"{rel}: the journal did not restore an interrupted mutant")
    return len(ms), len(ops), len(expected)


def main(argv=None):
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    ap = argparse.ArgumentParser(prog="mutate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--src", default=str(root), help="source root (mutated in place, always restored)")
        p.add_argument("--scope", default=str(here / "scope.txt"), help="files and functions to mutate")
        p.add_argument("--count", type=int, default=100, help="mutants to sample (0: all, list only)")
        p.add_argument("--seed", type=int, default=1)

    p = sub.add_parser("list", help="print the sampled mutants")
    common(p)
    p = sub.add_parser("run", help="the mutation pass")
    common(p)
    p.add_argument("--build", default=str(root / "build-mutate"), help="dedicated, configured build directory")
    p.add_argument("--build-args", default="-j2", help="extra arguments to cmake --build")
    p.add_argument("--stage", action="append",
                   help="ctest selection for one stage, run in order (default: smoke unit tests, then the "
                        "rest of the default tier, without the fuzzer corpora)")
    p.add_argument("--test-cmd", default="", help="one shell command instead of every stage (run in BUILD)")
    p.add_argument("--python-cmd", default=None,
                   help="the Python stage, run in SRC (default: BUILD/venv's pip installs SRC/python, then pytest "
                        "over python/tests and examples/torch_engine; '' drops it)")
    p.add_argument("--build-cmd", default="", help="instead of cmake --build BUILD BUILD_ARGS (run in SRC)")
    p.add_argument("--ctest-args", default="-j2 --stop-on-failure", help="arguments for every ctest stage")
    p.add_argument("--python-for-package-only", action="store_true",
                   help="run the Python stage for mutants of python/ only, not for the libraries the package links")
    p.add_argument("--test-timeout", type=int, default=120, help="per-test timeout (s)")
    p.add_argument("--stage-timeout", type=int, default=900, help="whole-stage timeout (s)")
    p.add_argument("--build-timeout", type=int, default=900)
    p.add_argument("--equivalent", default=str(here / "equivalent.txt"), help="declared equivalent mutants")
    p.add_argument("--only", default="", help="comma-separated mutant ids to run, from every site (no sample)")
    p.add_argument("--out", default=None, help="where the kill table goes (default: BUILD/mutation)")
    p.add_argument("--target", type=float, default=0.95, help="exit 1 below this kill rate")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated test run")
    p.add_argument("--every-test", action="store_true",
                   help="run every test of a stage for every mutant, also those that load no mutated binary")
    p = sub.add_parser("table", help="merge kill tables (later rows win) and apply the declared equivalents")
    p.add_argument("csv", nargs="+")
    p.add_argument("--equivalent", default=str(here / "equivalent.txt"))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--target", type=float, default=0.95)
    p = sub.add_parser("selftest", help="the tool on a fixture")
    p.add_argument("--fixture", default=str(here / "fixture.cpp"))
    p.add_argument("--py-fixture", default=str(here / "fixture.py"))
    p.add_argument("--compile", action="store_true", help="also compile each mutant with -fsyntax-only")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if not args.stage:
            # The default tier without the fuzzer corpora and this tool's own self-test, cheap tests first:
            # the smoke unit tests; then the tests of the command line, the judge and the loaders (seconds
            # each, and where most mutants of the judge die); then the rest (property suites, gates).
            judge = ("^(CliInput|Cli|CacheIn|CommandLine|RunCommand|BenchCommand|SpansCommand|OracleCommand|"
                     "ReplayErrorCommand|ReplaySweep|RunRequest|RunDiffReport|DiffRuns|Isolation|JudgePlant|"
                     "JudgePlantCli|Gate|GateSupports|GoldenCalibration|fuzz\\.hdf5-crash)")
            args.stage = [f"-L smoke -LE long -E '^(fuzz|mutate)\\.'",
                          f"-LE 'long|smoke' -R '{judge}'",
                          f"-LE 'long|smoke' -E '{judge}|^(fuzz|mutate)\\.'"]
        if args.python_cmd is None:
            venv = Path(args.build).resolve() / "venv" / "bin"
            tests = " ".join(d for d in ("python/tests", "examples/torch_engine") if (Path(args.src) / d).is_dir())
            # The example engine's BLAS pinned as scripts/test-python.sh pins it.
            args.python_cmd = (f"{venv}/pip install -q --disable-pip-version-check --no-build-isolation --no-deps "
                               f". && OPENBLAS_CORETYPE=${{OPENBLAS_CORETYPE:-Haswell}} {venv}/python -m "
                               f"pytest -x -q -p no:cacheprovider {tests}")
        args.build = str(Path(args.build).resolve())
        args.src = str(Path(args.src).resolve())
        if args.out is None:
            args.out = str(Path(args.build) / "mutation")
        if args.count <= 0:
            ap.error("run: --count must be >= 1")
        return cmd_run(args)
    if args.cmd == "list":
        return cmd_list(args)
    if args.cmd == "table":
        return cmd_table(args)
    return cmd_selftest(args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LexError as e:
        print(f"mutate: {e}", file=sys.stderr)
        sys.exit(2)
