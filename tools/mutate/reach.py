"""Which tests can see a mutant (tools/mutate/mutate.py, docs/mutation.md).

The mutation build links every library shared and never relinks an executable when a library
changes, so a mutant of a C++ file changes the code of exactly the binaries compiled from that file:
its shared library, or its executable. A test whose processes load none of them runs the same
machine code with and without the mutant and gives the same verdict (the tests are deterministic),
so running it says nothing about the mutant. The pass skips those tests; every other test still
runs, and a survivor is still a mutant that every test able to see it has passed.

What a test's processes load: its executable's shared libraries (ldd, transitively); when the
executable carries the path of the `ced` binary (the command-line tests run it as a child) or its
command names a binary of the build, those binaries' libraries too. A test run by a script (bash,
python) may start anything, so it can see every mutant and always runs.
"""

import json
import subprocess
from pathlib import Path


def _ldd(path, cache):
    if path not in cache:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
        libs = {str(Path(path).resolve())}
        for line in out.splitlines():
            if "=>" in line:
                target = line.split("=>", 1)[1].strip().split(" (")[0].strip()
                if target.startswith("/"):
                    libs.add(str(Path(target).resolve()))
        cache[path] = libs
    return cache[path]


def _is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


class Reach:
    """The tests of a configured build (CTest numbers, names) and what each one's processes load."""

    def __init__(self, build):
        self.build = Path(build).resolve()
        listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=self.build, capture_output=True,
                                 text=True, check=True).stdout
        tests = json.loads(listing)["tests"]
        self.number = {t["name"]: k + 1 for k, t in enumerate(tests)}  # CTest's own numbering
        self._ldd = {}
        binaries = [p for p in self.build.rglob("*") if p.is_file() and ".so" not in p.suffixes
                    and not {"CMakeFiles", "venv", "mutation"} & set(p.parts) and _is_elf(p)]
        children = {}  # executable -> the build's binaries its image names (the children it starts)
        self.loads = {}  # test name -> set of resolved binaries, None when unknown (a script)
        for t in tests:
            cmd = t.get("command") or []
            exe = Path(cmd[0]) if cmd else None
            if exe is None or not _is_elf(exe):
                self.loads[t["name"]] = None
                continue
            if exe not in children:
                image = exe.read_bytes()
                children[exe] = [b for b in binaries if b != exe and str(b).encode() in image]
            libs = set(_ldd(exe, self._ldd))
            for b in children[exe] + [b for b in binaries if str(b) in cmd[1:]]:
                libs |= _ldd(b, self._ldd)
            self.loads[t["name"]] = libs

    def stage_names(self, selection):
        """The names of the tests a CTest selection (`-L smoke -E …`) picks, in order."""
        out = subprocess.run(f"ctest {selection} --show-only=json-v1", cwd=self.build, shell=True,
                             capture_output=True, text=True, check=True).stdout
        return [t["name"] for t in json.loads(out)["tests"]]

    def binaries_of(self, rel):
        """The binaries compiled from source file `rel` (a path relative to the source root): the
        shared library or executable of every target with an object file of it."""
        rel = Path(rel)
        out = set()
        for obj in (self.build / rel.parent / "CMakeFiles").glob(f"*.dir/{rel.name}.o"):
            target = obj.parent.name[:-len(".dir")]
            for name in (f"lib{target}.so", target):
                for p in (self.build / rel.parent).rglob(name):
                    if p.is_file() and _is_elf(p):
                        out.add(str(p.resolve()))
        return out

    def closure(self, libraries):
        """The binaries the given shared libraries (file names, e.g. libced_io.so) load, themselves included."""
        out = set()
        for name in libraries:
            for p in self.build.rglob(name):
                if p.is_file():
                    out |= _ldd(p, self._ldd)
        return out

    def sees(self, name, binaries):
        """Whether test `name` can see a change to any of `binaries` (None: unknown, so yes)."""
        libs = self.loads.get(name)
        return libs is None or binaries is None or bool(libs & binaries)
