#!/usr/bin/python3
"""tools/calls.py - which file of a folder calls which, and its cycles.

    tools/calls.py daemon            # the graph and its cycles
    tools/calls.py --check daemon    # exit 1 when the files call in a cycle

A file "calls" another when it names a function that the other defines
(not static): a call, or a function pointer taken. Read from the source
with regular expressions (functions are defined at column 0 in this
project's style), so it needs no compiler. The layering rule: a folder's
files form a tree, no file calls into a file that uses it (a lower file
that must make an upper one act takes a callback).
"""
import os
import re
import sys

DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b([a-z_]\w*)\s*\(([^;]*?)$",
                 re.M)
IDENT = re.compile(r"\b([a-z_]\w*)\b")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def defined(text):
    """Names of the non-static functions a file defines."""
    out = set()
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = DEF.match(line)
        if not m or line.startswith((" ", "\t", "#", "}")):
            continue
        # A definition: the line (or one of the next few) ends in "{"
        # before any ";".
        rest = "\n".join(lines[i:i + 8])
        brace, semi = rest.find("{"), rest.find(";")
        if brace >= 0 and (semi < 0 or brace < semi):
            out.add(m.group(1))
    return out


def graph(folder):
    files = sorted(f for f in os.listdir(folder) if f.endswith(".c"))
    text = {f: strip(open(os.path.join(folder, f)).read()) for f in files}
    owner = {}
    for f in files:
        for name in defined(text[f]):
            owner[name] = f
    edges = {f: set() for f in files}
    for f in files:
        for name in set(IDENT.findall(text[f])):
            g = owner.get(name)
            if g is not None and g != f:
                edges[f].add(g)
    return edges


def cycles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv):
    check = "--check" in argv
    folders = [a for a in argv if not a.startswith("--")] or ["daemon"]
    bad = 0
    for folder in folders:
        edges = graph(folder)
        print("%s: who calls whom" % folder)
        for f in sorted(edges):
            print("  %-16s -> %s" % (f, ", ".join(sorted(edges[f])) or "-"))
        cyc = cycles(edges)
        for c in cyc:
            back = [(a, b) for a in c for b in c if b in edges[a]]
            print("  CYCLE among %s: %s" % (", ".join(c), ", ".join(
                "%s->%s" % e for e in back)))
        if not cyc:
            print("  no cycle: the files form a tree (a DAG)")
        bad += len(cyc)
    return 1 if check and bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
