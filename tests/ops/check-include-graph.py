#!/usr/bin/env python3
"""check-include-graph.py SOURCE_ROOT — fails when the agent's modules
include each other in a circle.

A module is agent/NAME.c with agent/NAME.h; it depends on every module
whose header its .c or .h includes ("agent/OTHER.h"). Dependencies must
point one way (agent/ARCHITECTURE.md): a lower layer that must reach up
takes a callback or a hook from the upper one instead of including it.

Circles that are known and not yet broken are listed in KNOWN below, each
as the modules of one circle; the check fails on any other circle, and on
a KNOWN entry that is no longer a circle (so the list only shrinks).
"""
import os
import re
import sys

# Each entry: the modules of one strongly connected set, sorted. None is
# left: conn hands frames and closes upward through struct conn_hooks, and
# the modules below sessions.c see sessions through session_registry.h.
KNOWN = []

INCLUDE = re.compile(r'^\s*#\s*include\s+"agent/([A-Za-z0-9_]+)\.h"', re.M)


def graph(agent_dir):
    deps = {}
    for entry in sorted(os.listdir(agent_dir)):
        name, ext = os.path.splitext(entry)
        if ext not in (".c", ".h"):
            continue
        with open(os.path.join(agent_dir, entry), encoding="utf-8") as f:
            text = f.read()
        mod = deps.setdefault(name, set())
        for other in INCLUDE.findall(text):
            if other != name:
                mod.add(other)
    for targets in list(deps.values()):
        for t in targets:
            deps.setdefault(t, set())
    return deps


def circles(deps):
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(deps[v]):
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
    for v in sorted(deps):
        if v not in index:
            visit(v)
    return sorted(out)


def one_path(deps, comp):
    """A readable circle inside comp: a shortest way back to its first module."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(deps[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return " -> ".join(reversed(path)) + " -> " + start
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return " <-> ".join(comp)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    deps = graph(os.path.join(root, "agent"))
    found = circles(deps)
    problems = []
    for comp in found:
        if comp not in KNOWN:
            problems.append("agent modules include each other in a circle: "
                            + one_path(deps, comp))
    for comp in KNOWN:
        if comp not in found:
            problems.append("KNOWN lists a circle that is gone, remove it: "
                            + ", ".join(comp))
    for comp in found:
        if comp in KNOWN:
            print("known circle (to be broken): " + one_path(deps, comp))
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print("agent include graph: %d modules, %d known circles, no new ones"
          % (len(deps), len(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
