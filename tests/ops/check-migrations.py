#!/usr/bin/env python3
"""check-migrations.py SOURCE_ROOT — the migrations are one forward-only
series in which every object is created once, in its final shape: each
function name is created by exactly one CREATE FUNCTION in the whole of
migrations/ (no overloads, no CREATE OR REPLACE of an earlier text), and no
migration alters or drops what the series itself created. A later change
to the schema is a new migration that says what it changes."""
import os
import re
import sys

CREATE_FUNCTION = re.compile(r'\bCREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(', re.I)
REWRITE = re.compile(r'^\s*(ALTER\s+(TABLE|FUNCTION|VIEW|TYPE|INDEX|SEQUENCE)|DROP\s+\w+|'
                     r'CREATE\s+OR\s+REPLACE)\b', re.I | re.M)


def code_of(text):
    """The SQL without -- comments, so a comment may mention anything."""
    return '\n'.join(line.split('--', 1)[0] for line in text.splitlines())


def main():
    root = sys.argv[1]
    mdir = os.path.join(root, 'migrations')
    files = sorted(f for f in os.listdir(mdir) if re.fullmatch(r'\d{4}_[a-z0-9_]+\.sql', f))
    if not files:
        sys.exit('check-migrations: no migrations in %s' % mdir)
    seen = {}
    bad = []
    for name in files:
        with open(os.path.join(mdir, name), encoding='utf-8') as f:
            code = code_of(f.read())
        for m in CREATE_FUNCTION.finditer(code):
            fn = m.group(2).lower()
            if fn in seen:
                bad.append('%s: function %s is created again (first in %s)' %
                           (name, fn, seen[fn]))
            else:
                seen[fn] = name
        for m in REWRITE.finditer(code):
            line = code.count('\n', 0, m.start()) + 1
            bad.append('%s:%d: %s: the series creates each object once, in its final shape' %
                       (name, line, m.group(0).strip()))
    if bad:
        print('\n'.join(bad), file=sys.stderr)
        sys.exit(1)
    print('check-migrations: %d migrations, %d functions, each created once' %
          (len(files), len(seen)))


if __name__ == '__main__':
    main()
