#!/usr/bin/env python3
"""Finds import cycles between the modules of every crate under gateway/.

For each `src/` tree (from `lib.rs` and `main.rs`) it follows the `mod` declarations, then reads
every `use crate::…`/`use super::…` (brace groups expanded) and every `crate::…`/`super::…` path
in the code. A reference from module A to module B is an edge between the two siblings under
their closest common parent: between the crate root's modules, or between the child modules of
one module directory. References to an ancestor or a descendant are not edges. Test modules
(`#[cfg(test)]` children, or `#[cfg(any(test, feature = …))]` ones, inline or not, and files
named `*test*.rs`) are left out.

Prints each cycle with the files and lines that close it and exits 1 if there is any.
Usage: scripts/module-cycles.py [crate-dir …]   (default: every gateway/*/ with a src/)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MOD_DECL = re.compile(
    r"((?:#\s*\[[^\]]*\]\s*)*)(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])"
)
PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]')
# `#[cfg(test)]`, or `#[cfg(any(test, feature = "…"))]`: test support that other crates' tests
# share through a feature (an in-memory fake and its contract suite). The feature's name is a
# string, blanked by `strip`.
CFG_TEST = re.compile(
    r"#\s*\[\s*cfg\s*\(\s*(?:test|any\s*\(\s*test\s*,\s*feature\s*=[^)]*\))\s*\)\s*\]"
)
USE_STMT = re.compile(r"\buse\s+([^;]*);")
RAW_STRING = re.compile(r'r(#*)"')
CHAR = re.compile(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'")
CODE_PATH = re.compile(r"\b((?:crate|super)(?:\s*::\s*super)*)((?:\s*::\s*\w+)+)")


def strip(text):
    """Blanks comments, strings and char literals, keeping every newline in place."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and RAW_STRING.match(text, i) and (i == 0 or not is_ident(text[i - 1])):
            hashes = RAW_STRING.match(text, i).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1 : j]) + '"')
            i = j + 1
        elif c == "'" and CHAR.match(text, i):
            m = CHAR.match(text, i)
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_ident(c):
    return c.isalnum() or c == "_"


def block_end(text, open_brace):
    depth = 0
    for j in range(open_brace, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def blank(text, start, end):
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path (tuple) -> (file, stripped text)
        self.modules = set()
        for root in ("lib.rs", "main.rs"):
            if (src / root).exists():
                self.load((), src / root, src, root=True)

    def load(self, path, file, child_dir, root=False):
        if not root and "test" in file.name:
            return
        text = strip(file.read_text(encoding="utf-8"))
        # Inline modules: test ones are dropped, others stay part of this file.
        for m in reversed(list(MOD_DECL.finditer(text))):
            attrs, name, end = m.groups()
            if end == "{" and CFG_TEST.search(attrs):
                text = blank(text, m.start(), block_end(text, m.end() - 1))
        self.files[path] = (file, text)
        self.modules.add(path)
        for m in MOD_DECL.finditer(text):
            attrs, name, end = m.groups()
            if end != ";" or CFG_TEST.search(attrs):
                continue
            explicit = PATH_ATTR.search(attrs)
            if explicit:
                child = file.parent / explicit.group(1)
            elif (child_dir / f"{name}.rs").exists():
                child = child_dir / f"{name}.rs"
            else:
                child = child_dir / name / "mod.rs"
            if not child.exists():
                continue
            grandchildren = child.parent if child.name == "mod.rs" else child.with_suffix("")
            self.load(path + (name,), child, grandchildren)

    def resolve(self, here, head, rest):
        """The deepest module named by `head::rest` seen from module `here`, or None."""
        parts = [p for p in re.split(r"\s*::\s*", head) if p]
        base = list(here) if parts[0] == "super" else []
        for p in parts:
            if p == "super":
                if not base:
                    return None
                base.pop()
        target = tuple(base)
        for segment in rest:
            if target + (segment,) in self.modules:
                target += (segment,)
            else:
                break
        return target

    def references(self, here, text):
        """(target module, line) for every crate/super path in a file's text."""
        found = []
        for m in USE_STMT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            tree = re.sub(r"\s+as\s+\w+", "", m.group(1))
            for path in expand(re.sub(r"\s+", "", tree)):
                segments = path.split("::")
                heads = []
                while segments and segments[0] in ("crate", "super"):
                    heads.append(segments.pop(0))
                if heads and (heads[0] == "crate" or all(h == "super" for h in heads)):
                    target = self.resolve(here, "::".join(heads), segments)
                    if target is not None:
                        found.append((target, line))
            text = blank(text, m.start(), m.end())
        for m in CODE_PATH.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            rest = [s for s in re.split(r"\s*::\s*", m.group(2)) if s]
            target = self.resolve(here, m.group(1), rest)
            if target is not None:
                found.append((target, line))
        return found

    def edges(self):
        """{scope: {(a, b): [(file, line), …]}} between sibling modules of each scope."""
        graph = {}
        for here, (file, text) in self.files.items():
            for target, line in self.references(here, text):
                common = 0
                while common < min(len(here), len(target)) and here[common] == target[common]:
                    common += 1
                if common == len(here) or common == len(target):
                    continue  # an ancestor or a descendant, not a sibling
                scope = here[:common]
                edge = (here[common], target[common])
                graph.setdefault(scope, {}).setdefault(edge, []).append((file, line))
        return graph


def expand(tree):
    """`a::{b,c::{d,e}}` -> a::b, a::c::d, a::c::e (whitespace and `as` renames removed)."""
    brace = tree.find("{")
    if brace < 0:
        return [tree.rstrip(":")]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    items, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in filter(None, items):
        item = "" if item == "self" else item
        out.extend(expand(prefix + item) if item else [prefix.rstrip(":")])
    return out


def cycles(nodes, edges):
    """Strongly connected groups of more than one node (Tarjan), each as one closing cycle."""
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return [(group, one_cycle(group, succ)) for group in groups]


def one_cycle(group, succ):
    """A shortest cycle through the group's first node."""
    start = group[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in succ[v]:
            if w == start:
                return paths[v] + [start]
            if w in group and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return [start]


def shown(file):
    try:
        return file.relative_to(ROOT)
    except ValueError:
        return file


def main(args):
    dirs = [Path(a) for a in args] or sorted(p.parent for p in ROOT.glob("gateway/*/src"))
    found = 0
    for crate_dir in dirs:
        crate = Crate(crate_dir.resolve() / "src")
        for scope, edges in sorted(crate.edges().items()):
            nodes = {n for edge in edges for n in edge}
            for group, cycle in cycles(nodes, edges):
                found += 1
                where = "crate root" if not scope else "::".join(scope)
                print(f"{crate_dir.name}: cycle among the modules of {where}: {', '.join(group)}")
                print(f"  closed by {' -> '.join(cycle)}:")
                for a, b in zip(cycle, cycle[1:]):
                    for file, line in sorted(set(edges[(a, b)])):
                        print(f"    {a} -> {b}: {shown(file)}:{line}")
    if found:
        print(f"{found} module cycle(s)")
        return 1
    print("no module cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
