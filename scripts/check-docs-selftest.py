#!/usr/bin/env python3
"""The test of scripts/check-docs.py: it must pass a clean miniature repository and fail,
with the right kind of message, on each planted problem (one per fresh copy).

Usage: check-docs-selftest.py   (exit 0 when every case behaves, 1 otherwise)

The planted texts are assembled at run time, so the repository itself never holds them
(the repository-wide check would flag them).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check-docs.py")
S = "\u00a7"  # the section sign

CLEAN = {
    "docs/spec.md": f"# Spec\n\n## 1. Config\n\n### 1.2 Validation\n\nSee [below](#2-weights) and [bg](background.md).\n\n"
                    f"## 2. Weights\n\nAs {S}1.2 says.\n",
    "docs/background.md": "# Background\n\nThe [spec](spec.md#1-config).\n",
    "README.md": "# Demo\n\nRead [the spec](docs/spec.md), [its weights](docs/spec.md#2-weights), "
                 "[the web](https://example.org/x.md).\n\n```cpp\nauto f = [&](const std::string& name) {};\n```\n"
                 "Inline `[a](missing.md)` code is not a link.\n",
    "src/a.cpp": f"// docs/spec.md {S}1.2: validation.\n// docs/family.md {S}3: its numerics.\nint main() {{ return 0; }}\n",
    # a second specification page, cited by name: its own bare sections cite it, not docs/spec.md
    "docs/family.md": f"# A family\n\n## 3. Numerics\n\n### 3.1 Codes\n\nAs {S}3.1 says; the [spec](spec.md) {S}1.2 too.\n",
}

# name -> (file, text appended, the message kind expected)
PLANTS = {
    "missing-file-link": ("README.md", "\nSee [gone](docs/nothing.md).\n", "link:"),
    "missing-anchor": ("README.md", "\nSee [gone](docs/spec.md#9-hdf5-files).\n", "link:"),
    "link-leaving-repo": ("docs/background.md", "\nSee [up](../../other/README.md).\n", "link:"),
    "absolute-link": ("README.md", "\nSee [abs](/etc/hosts).\n", "link:"),
    "reference-link": ("README.md", "\n[ref]: docs/absent.md\n", "link:"),
    "missing-section": ("src/a.cpp", f"// docs/spec.md {S}3.4: selection.\n", "section:"),
    "missing-section-in-md": ("README.md", f"\nAs {S}7 says.\n", "section:"),
    # sections that exist in docs/spec.md but not in the page they cite
    "section-of-another-page": ("src/a.cpp", f"// docs/family.md {S}1.2: validation.\n", "section:"),
    "bare-section-in-cited-page": ("docs/family.md", f"\nAs {S}2 says.\n", "section:"),
    "old-citation": ("src/a.cpp", "// SPEC" + f" {S}1: config.\n", "old-cite:"),
    "sibling-shared-path": ("README.md", "\nThe contract is in `.." + "/shared/x`.\n", "outside:"),
    "external-contract": ("src/a.cpp", "// see SPEC" + ".md\n", "outside:"),
    "machine-path": ("scripts/x.sh", "cd /" + "work/main && make\n", "outside:"),
    "tool-library": ("scripts/x.sh", "# read ." + "library/device/README\n", "outside:"),
}


def write_tree(root, extra=None):
    files = dict(CLEAN)
    files["scripts/x.sh"] = "#!/bin/sh\necho ok\n"
    if extra:
        path, text = extra
        files[path] = files.get(path, "") + text
    for rel, text in files.items():
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)


def run(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="check-docs-") as tmp:
        clean = os.path.join(tmp, "clean")
        write_tree(clean)
        rc, out = run(clean)
        print(f"clean tree: exit {rc}")
        if rc != 0:
            failures.append(f"clean tree: expected exit 0, got {rc}:\n{out}")
        for name, (path, text, kind) in PLANTS.items():
            root = os.path.join(tmp, name)
            write_tree(root, (path, text))
            rc, out = run(root)
            hit = [l for l in out.splitlines() if kind in l]
            print(f"{name}: exit {rc}, {hit[0] if hit else 'no ' + kind + ' line'}")
            if rc != 1 or not hit:
                failures.append(f"{name}: expected exit 1 with a '{kind}' line, got {rc}:\n{out}")
            shutil.rmtree(root)
        # Bad usage: a root without docs/spec.md.
        bare = os.path.join(tmp, "bare")
        os.makedirs(bare)
        rc, out = run(bare)
        print(f"no docs/spec.md: exit {rc}")
        if rc != 2:
            failures.append(f"no docs/spec.md: expected exit 2, got {rc}:\n{out}")
    for f in failures:
        print("FAIL " + f)
    print("PASS: check-docs passes the clean tree and fails every planted problem" if not failures
          else f"FAIL: {len(failures)} case(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
