#!/usr/bin/env python3
"""check-include-graph.py SOURCE_ROOT [BUILD_ROOT] — fails when the agent's
modules include each other in a circle, or when the files of the agent or
of libpgcoord call each other in a circle.

Includes: a module is agent/NAME.c with agent/NAME.h; it depends on every
module whose header its .c or .h includes ("agent/OTHER.h").

Calls (with BUILD_ROOT): a file depends on the file that defines each
function it calls, read from the compiled objects' symbols (`nm`: a
function one object leaves undefined, `U`, and another defines, `T`). This
sees what the includes cannot: a file that declares another's function
itself, or reaches it through a header that belongs to neither. Covered:
agent/ (the agent core library and the migration runner) and client-lib/
(libpgcoord itself; pgcoordctl and the bindings are its clients).

Dependencies must point one way (agent/ARCHITECTURE.md): a lower layer that
must reach up takes a callback or a hook from the upper one instead of
including or calling it.

Circles that are known and not yet broken are listed below: in KNOWN
(includes) as the modules of one circle, in KNOWN_CALLS (calls) as the
calls from one file to another that close a circle. The check fails on any
other circle (of the includes, or of the calls once the known ones are set
aside), and on a known entry that is no longer a circle (so the lists only
shrink).
"""
import glob
import os
import re
import subprocess
import sys

# Each entry: the modules of one strongly connected set, sorted. None is
# left: conn hands frames and closes upward through struct conn_hooks, and
# the modules below sessions.c see sessions through session_registry.h.
KNOWN = []

# Each entry: (caller, callee), files from the source root: the calls from
# caller into callee close a circle that is known and not yet broken. None
# is left: the method table (dispatch.c) calls the handlers, which call the
# request helpers (request.c), which call nothing above them.
KNOWN_CALLS = []

# Where meson puts each library's objects (under BUILD_ROOT), and the
# source directory their files come from.
CALL_SCOPES = [
    ("agent", ["agent/libpgcoord_agent_core.a.p", "agent/libpgcoord_migrate.a.p"]),
    ("client-lib", ["client-lib/libpgcoord.*.p"]),
]

# nm's letters for a function defined in the object (weak ones included).
DEFINED_TEXT = ("T", "W")

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
    """Tarjan's strongly connected components of more than one node."""
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


def object_symbols(objs):
    """{object: (defined functions, undefined symbols)} of the object files,
    read by one nm for all of them: a process per object made the test
    slow on a busy machine."""
    out = subprocess.run(["nm", "-P", "-A"] + list(objs), check=True,
                         capture_output=True, text=True).stdout
    symbols = {obj: (set(), set()) for obj in objs}
    for line in out.splitlines():
        # -A prefixes each line with "OBJECT: "
        obj, sep, rest = line.partition(": ")
        fields = rest.split()
        if not sep or obj not in symbols or len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        defined, undefined = symbols[obj]
        if kind in DEFINED_TEXT:
            defined.add(name)
        elif kind == "U":
            undefined.add(name)
    return symbols


def call_graph(src_root, build_root, src_dir, obj_globs):
    """{file: {callee file: {functions}}} for the sources of src_dir whose
    objects are found under build_root; meson names an object SRC.c.o."""
    objects = {}
    for pattern in obj_globs:
        dirs = glob.glob(os.path.join(build_root, pattern))
        if not dirs:
            raise SystemExit("no objects at %s: build first (meson compile)"
                             % os.path.join(build_root, pattern))
        for d in dirs:
            for obj in sorted(glob.glob(os.path.join(d, "*.c.o"))):
                src = os.path.join(src_dir, os.path.basename(obj)[:-2])
                if os.path.exists(os.path.join(src_root, src)):
                    objects[src] = obj
    defined_in, wants = {}, {}
    symbols = object_symbols(sorted(objects.values()))
    for src, obj in sorted(objects.items()):
        defined, undefined = symbols[obj]
        for name in defined:
            defined_in[name] = src
        wants[src] = undefined
    calls = {src: {} for src in objects}
    for src, undefined in wants.items():
        for name in undefined:
            callee = defined_in.get(name)
            if callee is not None and callee != src:
                calls[src].setdefault(callee, set()).add(name)
    return calls


def describe_calls(calls, comp):
    """Every call between the files of one circle, a line each."""
    lines = []
    for caller in comp:
        for callee in comp:
            for fn in sorted(calls[caller].get(callee, ())):
                lines.append("    %s -> %s in %s" % (caller, fn, callee))
    return "\n".join(lines)


def scc_of(deps):
    """{node: index of its circle} for the nodes in some circle."""
    return {v: i for i, comp in enumerate(circles(deps)) for v in comp}


def check_calls(src_root, build_root, problems):
    nfiles = 0
    graphs = {}
    for src_dir, obj_globs in CALL_SCOPES:
        graphs[src_dir] = call_graph(src_root, build_root, src_dir, obj_globs)
        nfiles += len(graphs[src_dir])
    known = set(KNOWN_CALLS)
    for src_dir, calls in sorted(graphs.items()):
        full = {f: set(t) for f, t in calls.items()}
        in_circle = scc_of(full)
        for caller, callee in KNOWN_CALLS:
            if caller not in calls:
                continue
            fns = ", ".join(sorted(calls[caller].get(callee, ())))
            if not fns or in_circle.get(caller, -1) != in_circle.get(callee, -2):
                problems.append("KNOWN_CALLS lists a call that closes no circle any "
                                "more, remove it: %s -> %s" % (caller, callee))
            else:
                print("known call circle (to be broken): %s -> %s (%s)"
                      % (caller, callee, fns))
        rest = {f: {t for t in ts if (f, t) not in known} for f, ts in full.items()}
        for comp in circles(rest):
            problems.append("files call each other in a circle: %s\n%s"
                            % (one_path(rest, comp), describe_calls(calls, comp)))
    for caller, callee in KNOWN_CALLS:
        if not any(caller in calls for calls in graphs.values()):
            problems.append("KNOWN_CALLS names a file that is gone, remove it: "
                            + caller)
    return nfiles, len(KNOWN_CALLS)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    build_root = sys.argv[2] if len(sys.argv) > 2 else None
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
    if build_root is not None:
        nfiles, nknown = check_calls(root, build_root, problems)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print("agent include graph: %d modules, %d known circles, no new ones"
          % (len(deps), len(found)))
    if build_root is not None:
        print("call graph: %d files, %d known circle-closing calls, no new circles"
              % (nfiles, nknown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
