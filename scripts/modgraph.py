#!/usr/bin/env python3
"""Import circles between the source files of a Rust crate; `make lint` runs it on src.
Usage: python3 scripts/modgraph.py [SRC_DIR]   (default src; exit status 1 if there is a circle)

An edge A -> B means file A names an item through a path that resolves to file B: `use` trees
and inline paths starting with `crate::`, `super::`, `self::` or the name of one of A's child
modules (2018 uniform paths). A path resolves to the deepest file module it reaches. Not edges:
`mod child;` declarations, and paths into A's own ancestors (a child using its parent's items),
so a parent and a child using each other is not a circle. Ignored: comments, literals, `tests.rs`,
`tests/` and `#[cfg(test)]` items; main.rs when lib.rs exists (a crate of its own).
Files that all reach each other form one tangle, counted as one circle and printed as its
shortest circle `a.rs -> b.rs -> a.rs`, with the tangle's other files.
"""
import re
import sys
from pathlib import Path

# Comments, string literals (raw and plain) and char literals, blanked before reading paths.
NOISE = re.compile(r"""//[^\n]*|/\*.*?\*/|r(#*)".*?"\1|"(?:\\.|[^"\\])*"|'(?:\\.[^']*|[^'\\])'""",
                   re.S)
CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*")
USE = re.compile(r"\buse\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])([A-Za-z_]\w*(?:::\w+)+)")


def clean(text):
    """The code without comments, literals and `#[cfg(test)]` items."""
    text = NOISE.sub(lambda m: '""' if m.group(0).endswith(("\"", "'")) else " ", text)
    out, pos = [], 0
    for m in CFG_TEST.finditer(text):
        if m.start() < pos:
            continue  # inside an item already dropped
        out.append(text[pos:m.start()])
        semi, brace = text.find(";", m.end()), text.find("{", m.end())
        if brace == -1 or -1 < semi < brace:  # `use ...;`, `mod tests;`, `const X: T = ...;`
            pos = semi + 1 if semi != -1 else len(text)
            continue
        depth, pos = 0, brace
        while pos < len(text):  # skip to the brace closing the item's body
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
            if depth == 0:
                break
    out.append(text[pos:])
    return "".join(out)


def split_top(s):
    """Split on the commas that are not inside braces."""
    parts, depth = [""], 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("")
        else:
            parts[-1] += ch
    return parts


def expand(tree, prefix=()):
    """`a::{b, c::{self, d as e}}` -> [(a, b), (a, c), (a, c, d)]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    if not tree or (tree.startswith("::") and not prefix):
        return []  # empty, or `::name`: another crate
    if "{" in tree:
        head, body = tree.split("{", 1)
        segs = tuple(s.strip() for s in head.split("::") if s.strip())
        parts = split_top(body.rsplit("}", 1)[0])
        return [p for part in parts for p in expand(part, prefix + segs)]
    # A trailing `self`, `*` or item name stops resolve()'s walk where the modules end.
    return [prefix + tuple(s.strip() for s in tree.split(" as ")[0].split("::") if s.strip())]


def resolve(path, here, modules):
    """The file module a path names from module `here`, or None (other crate, local name)."""
    first, rest = path[0], list(path[1:])
    if first in ("crate", "$crate"):
        base = ()
    elif first in ("self", "super"):
        base = here if first == "self" else here[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif here + (first,) in modules:  # uniform path into a child module
        base = here + (first,)
    else:
        return None
    target = base
    for seg in rest:
        if target + (seg,) not in modules:
            break
        target += (seg,)
    return target


def reachable(start, edges):
    """The modules reached from `start` by one edge or more."""
    seen, todo = set(), list(edges[start])
    while todo:
        if (node := todo.pop()) not in seen:
            seen.add(node)
            todo.extend(edges[node])
    return seen


def shortest_circle(start, edges, within):
    """The shortest circle from `start` back to it through modules of `within` (BFS)."""
    todo, seen = [[start]], {start}
    for trail in todo:
        for nxt in edges[trail[-1]]:
            if nxt == start:
                return trail
            if nxt in within and nxt not in seen:
                seen.add(nxt)
                todo.append(trail + [nxt])


def find_circles(nodes, edges):
    """One circle per tangle (files that all reach each other): its shortest, and the tangle."""
    reach = {n: reachable(n, edges) for n in nodes}
    found, done = [], set()
    for n in nodes:
        if n in reach[n] and n not in done:
            tangle = {m for m in reach[n] if n in reach[m]}
            done |= tangle
            circles = [shortest_circle(m, edges, tangle) for m in sorted(tangle)]
            found.append((min(circles, key=len), tangle))
    return found


def main():
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    files = {}  # module path -> file: a/b.rs is (a, b), a/mod.rs is (a,), lib.rs is ()
    for f in sorted(src.rglob("*.rs")):
        parts = f.relative_to(src).with_suffix("").parts
        if "tests" in parts or (parts == ("main",) and (src / "lib.rs").exists()):
            continue
        root = parts[-1] == "mod" or parts in (("lib",), ("main",))
        files[parts[:-1] if root else parts] = f.relative_to(src).as_posix()
    modules = set(files)

    edges = {}
    for here, name in files.items():
        code = clean((src / name).read_text(encoding="utf-8"))
        paths = [p for tree in USE.findall(code) for p in expand(tree)]
        code = USE.sub(" ", code)
        paths += [tuple(m.split("::")) for m in INLINE.findall(code)]
        targets = {resolve(p, here, modules) for p in paths if p}
        # A file naming itself or one of its ancestors is not an edge.
        edges[here] = sorted(t for t in targets if t is not None and here[:len(t)] != t)

    circles = find_circles(sorted(files), edges)
    print(f"modgraph: {len(files)} files, {sum(map(len, edges.values()))} edges, "
          f"{len(circles)} circles")
    for circle, tangle in circles:
        print(" -> ".join(files[m] for m in circle + [circle[0]]))
        if len(tangle) > len(circle):  # longer circles share these files: break the short one first
            others = sorted(files[m] for m in tangle - set(circle))
            print("  also in this tangle:", ", ".join(others))
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
