"""The mutation tool's self-test fixture for Python (tools/mutate/mutate.py selftest): every
operator must apply here, nothing may be mutated in a comment, a string, a docstring or an
f-string (the lines marked NOT_MUTATED), every mutant must parse and restore to these bytes.
Expected mutants, as `operator line-after-mutation`:
EXPECT: cmp_flip if a != b:
EXPECT: off_by_one return [i for i in range(n) if i <= n]
EXPECT: off_by_one return [i for i in range(n) if i < n - 1]
EXPECT: logic_swap return a > 0 or b > 0
EXPECT: assign_drop ok = check(a)
EXPECT: drop_term return a
EXPECT: swap_args return pick(b, a)
EXPECT: negate_cond while not (a < b):
EXPECT: return_early return
EXPECT: const_shift return x > 4
EXPECT: const_shift return x > 2
EXPECT: const_shift return x * 0.976
EXPECT: self_compare if a == a:
"""

TEXT = "a < b and c or d == e"  # NOT_MUTATED


def pick(x, y):
    """A docstring: a < b and 1 == 2 NOT_MUTATED"""
    return x if x - y > 0 else y


def check(x):
    return x > 3


def scaled(x):
    return x * 0.975


def compare(a, b):
    if a == b:
        return 1
    return a > 0 and b > 0


def below(n):
    return [i for i in range(n) if i < n]


def add(a, b):
    return a + b


def ordered(a, b):
    return pick(a, b)


def every(a):
    ok = True
    ok &= check(a)
    return ok


def walk(a, b):
    while a < b:
        a += 1
    label = f"{a < b} {a == 1}"  # NOT_MUTATED
    return a, label
