#!/usr/bin/env python3
"""Checks that the repository stands on its own (docs/spec.md §0 explains the citation form).

Usage: check-docs.py [ROOT]   (default: the repository this script is in)

Fails (exit 1, one line per problem) on:
  link      a Markdown link in a .md file whose relative target (file, or #anchor in a .md
            file) does not resolve; web links (http, https, mailto) are not followed;
  section   a "§N" section number anywhere in a text file that is not a heading of the page it
            cites: the last specification page (a page of docs/ that some text cites as
            `docs/NAME.md §N`) named before it on its line, else the page it stands in when that
            is one, else docs/spec.md;
  old-cite  the retired citation form (the word SPEC followed by §): cite `docs/spec.md §N`;
  outside   a reference to something outside the repository: a sibling checkout's shared
            folder, an external contract file, or an absolute path into the filesystem of the
            machine the project was developed on (see OUTSIDE below).
Exit 2 on bad usage (ROOT is not a directory, or it has no docs/spec.md).

Files: `git ls-files` when ROOT is a git work tree, else every file under ROOT except
build outputs and hidden folders. Binary files (a NUL byte) are skipped.
"""
import os
import re
import subprocess
import sys

# The patterns are assembled from pieces so that this file, which is checked like any
# other, does not match itself (nor a grep of the repository for them).
OUTSIDE = [
    (re.compile(re.escape("..") + "/" + "shared"), "a path into a sibling 'shared' folder"),
    (re.compile(r"\bSPEC" + r"\.md\b"), "the external contract file (cite docs/spec.md)"),
    (re.compile(r"(?<![\w.])/" + "work" + r"/"), "an absolute path of the development machine"),
    (re.compile(r"\." + "library" + r"\b"), "the development machine's tool library"),
    (re.compile(r"/tmp/" + "issues"), "the development machine's task notes"),
]
OLD_CITE = re.compile(r"\bSPEC" + r"\s*§")
SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SECTION_HEADING = re.compile(r"^(\d+(?:\.\d+)*)\.?\s")
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SKIP_DIRS = {".git", "build", "device-bundle", "device-out", "__pycache__"}
SPEC = "docs/spec.md"


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
        if os.path.exists(os.path.join(root, ".git")):
            return sorted(p for p in out.decode("utf-8", "replace").split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith((".", "build"))]
        for n in names:
            files.append(os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/"))
    return sorted(files)


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data[:65536]:
        return None
    return data.decode("utf-8", "replace")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    h = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = "".join(ch for ch in h if ch.isalnum() or ch in " -_" or ord(ch) > 127 and ch.isalpha())
    return h.replace(" ", "-")


def markdown_lines(text):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line)


def anchors_of(text):
    seen, out = {}, set()
    for _, line in markdown_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.add(s if k == 0 else f"{s}-{k}")
    return out


def spec_sections(text):
    out = set()
    for _, line in markdown_lines(text):
        m = HEADING.match(line)
        if m:
            s = SECTION_HEADING.match(m.group(2))
            if s:
                out.add(s.group(1))
    return out


PAGE = re.compile(r"([A-Za-z0-9_-]+)\.md\b")
CITED_PAGE = re.compile(r"docs/([A-Za-z0-9_-]+)\.md`? ?§")


def cited_page(before, rel, numbered):
    """The page a "§N" cites: the last specification page named earlier on its line (`docs/v41.md §3`,
    `[v41.md](v41.md) §3`), else the page it stands in when that is one, else docs/spec.md."""
    for name in reversed(PAGE.findall(before)):
        if f"docs/{name}.md" in numbered:
            return f"docs/{name}.md"
    return rel if rel in numbered else SPEC


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(root):
        print(f"check-docs: error: '{root}' is not a directory", file=sys.stderr)
        return 2
    spec_path = os.path.join(root, SPEC)
    if not os.path.isfile(spec_path):
        print(f"check-docs: error: '{root}' has no {SPEC}", file=sys.stderr)
        return 2
    files = tracked_files(root)
    texts = {}
    for rel in files:
        full = os.path.join(root, rel)
        if os.path.isfile(full):
            t = read_text(full)
            if t is not None:
                texts[rel] = t
    sections = spec_sections(texts.get(SPEC, read_text(spec_path) or ""))
    # Every page of docs/ with numbered headings is a citable specification (docs/spec.md, docs/v41.md).
    # A page of docs/ is a specification when some text cites one of its sections by its name
    # ("docs/v41.md §3"); its own bare "§N" then cite it. Other pages' bare "§N" cite docs/spec.md.
    cited = {f"docs/{m.group(1)}.md" for t in texts.values() for m in CITED_PAGE.finditer(t)}
    numbered = {rel: spec_sections(t) for rel, t in texts.items() if rel in cited and spec_sections(t)}
    numbered[SPEC] = sections
    anchor_cache = {}
    problems = []

    for rel, text in texts.items():
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            for pat, what in OUTSIDE:
                if pat.search(line):
                    problems.append(f"{rel}:{n}: outside: {what}: {line.strip()[:120]}")
            if OLD_CITE.search(line):
                problems.append(f"{rel}:{n}: old-cite: write `{SPEC} §N` instead: {line.strip()[:120]}")
            for m in SECTION.finditer(line):
                target = cited_page(line[:m.start()], rel, numbered)
                if m.group(1) not in numbered[target]:
                    problems.append(f"{rel}:{n}: section: §{m.group(1)} is not a heading of {target}")
        if not rel.endswith(".md"):
            continue
        base = os.path.dirname(rel)
        for n, line in markdown_lines(text):
            targets = [m.group(1) for m in LINK.finditer(line)]
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # a web or mail link: not checked offline
                path, _, anchor = target.partition("#")
                if path.startswith("/"):
                    problems.append(f"{rel}:{n}: link: '{target}' is absolute; use a path relative to {rel}")
                    continue
                dest = os.path.normpath(os.path.join(base, path)) if path else rel
                if dest.startswith(".."):
                    problems.append(f"{rel}:{n}: link: '{target}' leaves the repository")
                    continue
                full = os.path.join(root, dest)
                if not os.path.exists(full):
                    problems.append(f"{rel}:{n}: link: '{target}' does not exist")
                    continue
                if anchor and dest.endswith(".md"):
                    if dest not in anchor_cache:
                        anchor_cache[dest] = anchors_of(texts.get(dest) or read_text(full) or "")
                    if anchor.lower() not in anchor_cache[dest]:
                        problems.append(f"{rel}:{n}: link: '{target}' has no heading for #{anchor} in {dest}")

    for p in problems:
        print(p)
    if problems:
        print(f"check-docs: {len(problems)} problem(s) in {len(texts)} files")
        return 1
    print(f"check-docs: {len(texts)} files, {len(sections)} sections of {SPEC}: every link and citation resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
