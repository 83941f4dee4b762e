#!/usr/bin/env python3
"""Import cycles between the modules inside each crate of the workspace.

    python3 bench/module_cycles.py            (from anywhere)

A module is one source file (`core/src/placement.rs` is `placement`, `controllers/src/
kubernetes/apply.rs` is `kubernetes::apply`). An edge A → B is a path in A's non-test code that
names B (`crate::b::…`, `super::b::…`, or `use` of either). Unit tests are left out: files
named `tests.rs` or under a `tests/` module, and everything after a `#[cfg(test)]` line, since
a test reaching into its neighbours is no layering. Each strongly connected set of two or more
modules is printed with its edges; the last line counts them. A circle is where two modules
can only be understood (and changed) together.
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PATH_RE = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)


def crates():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        text = f.read()
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", text).group(1)
    names = [m.strip().strip('"') for m in members.split(",") if m.strip()]
    return [("meridian", os.path.join(ROOT, "src"))] + [(n, os.path.join(ROOT, n, "src")) for n in names]


def modules(src):
    """Module path (tuple) → file, for every non-test file of a crate."""
    found = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)[:-3].split(os.sep)
            if "tests" in rel[:-1]:
                continue
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            found[tuple(rel)] = os.path.join(dirpath, name)
    return found


def non_test_text(path):
    lines = []
    with open(path) as f:
        for line in f:
            if line.strip().startswith("#[cfg(test)]"):
                break
            if line.lstrip().startswith("//"):
                continue
            lines.append(line)
    return "".join(lines)


def resolve(mods, base, parts):
    """The longest module named by `parts` (relative to `base`), or None."""
    path = list(base) + parts
    while path:
        if tuple(path) in mods:
            return tuple(path)
        path.pop()
    return None


def edges_of(mods, module, text):
    targets = set()

    def add(kind, rest):
        base = () if kind == "crate" else module[:-1]
        if kind == "super" and os.path.basename(mods[module]) in ("mod.rs", "lib.rs"):
            base = module[:-1]
        parts = [p for p in rest.split("::") if p]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
        target = resolve(mods, base, parts)
        if target is not None and target and target != module and target[: len(module)] != module:
            targets.add(target)

    for kind, prefix, group in USE_GROUP_RE.findall(text):
        for item in re.split(r",(?![^{]*\})", group):
            item = item.strip().split(" as ")[0]
            head = re.match(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*", item)
            if head:
                add(kind, prefix + "::" + head.group(0))
    for kind, rest in PATH_RE.findall(text):
        add(kind, rest)
    return targets


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    total = 0
    for crate, src in crates():
        mods = modules(src)
        graph = {m: edges_of(mods, m, non_test_text(f)) for m, f in mods.items()}
        # A parent module naming its child (declaring it) is structure, not an import.
        for comp in sccs(graph):
            total += 1
            names = ["::".join(m) for m in comp]
            print(f"{crate}: {' ↔ '.join(names)}")
            members = set(comp)
            for m in comp:
                for t in sorted(graph[m] & members):
                    print(f"    {'::'.join(m)} → {'::'.join(t)}")
    print(f"{total} import cycles between modules")


if __name__ == "__main__":
    main()
