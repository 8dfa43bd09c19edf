"""The tree's shape, checked (tests/test_floors.sh): the floors of lib/floors, top first, where a
file may include its own floor's headers and those below, never above (but the includes the list
allows, each of which must still be there); no include cycle between folders; no source file past
700 lines under lib/, transports/, tools/ and bench/, no Python module past 500 under python/;
each layer's state header ("own" in lib/floors) included only from its own folder and those
under it.

    floors.py SRCDIR        prints each fault and exits 1, or prints a summary and exits 0
"""

import os
import re
import subprocess
import sys

LIMIT = 700
PYTHON_LIMIT = 500
SOURCES = (".c", ".h", ".cu", ".cuh", ".cc")


def read_floors(path):
    floors, allowed, own = [], set(), set()
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            if line[0] == "allow":
                allowed.add((line[1], line[2]))
            elif line[0] == "own":
                own.add(line[1])
            else:
                floors.append((line[0], line[1:]))
    return floors, allowed, own


def folder_of(path, folders):
    """The listed folder holding path (the longest that matches), or None."""
    best = None
    for folder in folders:
        if (path == folder or path.startswith(folder + "/")) and (
                best is None or len(folder) > len(best)):
            best = folder
    return best


def resolve(src, including, name):
    """The tree path of header name, included by file including (tree path), or None for a
    header outside the tree (a system's, or one configure writes)."""
    for base in (os.path.dirname(including), "lib", "transports"):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.exists(os.path.join(src, candidate)):
            return candidate
    return None


def tracked(src, tops):
    """The files under tops that git tracks (not what a build wrote beside them, such as the CUDA
    kernels' fatbin header); every file under them where src is no git checkout."""
    try:
        out = subprocess.run(["git", "-C", src, "ls-files", "--"] + list(tops), check=True,
                             capture_output=True, text=True).stdout.split()
        if out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    return [os.path.relpath(os.path.join(root, name), src) for top in tops
            for root, _, names in os.walk(os.path.join(src, top)) for name in names]


def main(src):
    floors, allowed, own = read_floors(os.path.join(src, "lib", "floors"))
    rank = {}  # folder -> floor index (0 = top)
    for i, (_, folders) in enumerate(floors):
        for folder in folders:
            rank[folder] = i
    faults, seen_allowed, edges, files = [], set(), {}, 0
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for folder in rank:
        for root, _, names in os.walk(os.path.join(src, folder)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(root, name), src)
                files += 1
                mine = folder_of(path, rank)
                with open(os.path.join(src, path), errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = include.match(line)
                        if not m:
                            continue
                        header = resolve(src, path, m.group(1))
                        theirs = folder_of(header, rank) if header else None
                        if header in own and not (path + "/").startswith(
                                os.path.dirname(header) + "/"):
                            faults.append("%s:%d includes %s, the state of %s's own layer"
                                          % (path, number, m.group(1), os.path.dirname(header)))
                        if theirs is None or theirs == mine:
                            continue
                        if (path, m.group(1)) in allowed:
                            seen_allowed.add((path, m.group(1)))
                            continue  # known, and left out of the cycles too
                        edges.setdefault(mine, set()).add(theirs)
                        if rank[theirs] < rank[mine]:
                            faults.append("%s:%d includes %s, of floor %s above its own (%s)"
                                          % (path, number, m.group(1), floors[rank[theirs]][0],
                                             floors[rank[mine]][0]))
    for header in sorted(own):
        if not os.path.exists(os.path.join(src, header)):
            faults.append("lib/floors names %s as a layer's own state, and it is gone" % header)
    for path, header in sorted(allowed - seen_allowed):
        faults.append("lib/floors allows %s to include %s, which it no longer does: take the "
                      "line out" % (path, header))
    # Cycles between folders: a depth-first search over the include edges.
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                faults.append("include cycle: %s" % " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    # Lengths.
    for path in tracked(src, ("lib", "transports", "tools", "bench", "python")):
        limit = PYTHON_LIMIT if path.endswith(".py") else LIMIT if path.endswith(SOURCES) else None
        if limit is None:
            continue
        with open(os.path.join(src, path), errors="replace") as f:
            lines = sum(1 for _ in f)
        if lines > limit:
            faults.append("%s has %d lines (at most %d)" % (path, lines, limit))
    for fault in faults:
        print("FAIL: %s" % fault)
    if not faults:
        print("floors: %d files in %d floors, %d include edges between folders, no include "
              "climbing but the %d that lib/floors allows, no cycle, none too long"
              % (files, len(floors), sum(len(v) for v in edges.values()), len(allowed)))
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
