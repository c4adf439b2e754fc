#!/usr/bin/env python3
"""check-migrations.py SOURCE_ROOT — the migrations are one forward-only
series in which every object is created once, in its final shape: each
function name is created by exactly one CREATE FUNCTION in the whole of
migrations/ (no overloads, no CREATE OR REPLACE of an earlier text), and no
migration alters or drops what the series itself created, but for the
redefinitions listed in REPLACES, DROPS, ALTERS and REWRITES. A later change
to the schema is a new migration that says what it changes."""
import os
import re
import sys

CREATE_FUNCTION = re.compile(r'\bCREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(', re.I)
REWRITE = re.compile(r'^\s*(ALTER\s+(TABLE|FUNCTION|VIEW|TYPE|INDEX|SEQUENCE)|DROP\s+\w+|'
                     r'CREATE\s+OR\s+REPLACE)\b', re.I | re.M)
REPLACE_FUNCTION = re.compile(r'^\s*CREATE\s+OR\s+REPLACE\s+FUNCTION\s+([\w.]+)\s*\(', re.I | re.M)

# migration -> the earlier functions it creates again, whole
REPLACES = {
    '0010_claim_owner.sql': {'pgcoord.permit_claim_as', 'pgcoord.permit_wait'},
    '0015_session_liveness.sql': {
        'pgcoord.agent_heartbeat', 'pgcoord.agent_register', 'pgcoord.agent_stop',
        'pgcoord.session_open', 'pgcoord.session_resume', 'pgcoord.session_is_live',
        'pgcoord.session_lock_live', 'pgcoord.permit_claim_as', 'pgcoord.permit_claim_group',
        'pgcoord.janitor_lapse_permits', 'pgcoord.record_recover',
        'pgcoord.janitor_expire_sessions'},
    '0016_ledger_events.sql': {'pgcoord.permits_check', 'pgcoord.permit_claim_as',
                               'pgcoord.permit_claim_group', 'pgcoord.permit_release_group',
                               'pgcoord.permit_release_one', 'pgcoord.janitor_purge_permits',
                               'pgcoord.permit_events_summarize',
                               'pgcoord.janitor_fold_audit'},
    '0017_beat.sql': {'pgcoord.lease_acquire', 'pgcoord.agent_heartbeat'},
    '0018_claim_after_quota.sql': {'pgcoord.permit_claim_as', 'pgcoord.permit_claim_group',
                                   'pgcoord.permit_release_one'},
    '0019_attached_leases.sql': {'pgcoord.agent_heartbeat', 'pgcoord.agent_beat',
                                 'pgcoord.lease_acquire', 'pgcoord.lease_release',
                                 'pgcoord.janitor_fold_audit'},
    '0020_expiry_from_dead_agents.sql': {'pgcoord.janitor_expire_sessions'},
    '0021_expiry_from_attached_sessions.sql': {'pgcoord.janitor_expire_sessions'},
}

# migration -> the earlier objects it drops, each named as its DROP statement
# begins (whitespace collapsed, lowercase); what it creates again in their
# place is checked as any creation is
DROPS = {
    '0013_ledger.sql': {'drop trigger quotas_no_overtaking on pgcoord.quotas'},
}

# migration -> the earlier objects it alters, each named as its ALTER
# statement reads (whitespace collapsed, lowercase)
ALTERS = {
    '0016_ledger_events.sql': {
        'alter table pgcoord.permit_events rename to permit_events_log',
        'alter table pgcoord.permits add column release_event bigint, add column release_actor '
        'text, add column admit_event bigint, add column admit_actor text',
        'alter table pgcoord.permits set (fillfactor = 90)',
    },
    '0019_attached_leases.sql': {
        'alter table pgcoord.leases rename to lease_rows',
        'alter table pgcoord.lease_rows alter column expires_at drop not null',
    },
}

# migration -> the earlier objects it changes in place, each named as its
# statement begins (whitespace collapsed, lowercase): a column constraint
# relaxed, a view created again with the same columns
REWRITES = {
    '0015_session_liveness.sql': {
        'alter table pgcoord.sessions alter column expires_at drop not null',
        'create or replace view pgcoord.live_sessions as'},
}


def code_of(text):
    """The SQL without -- comments, so a comment may mention anything."""
    return '\n'.join(line.split('--', 1)[0] for line in text.splitlines())


def arguments(code, start):
    """The argument list opening at code[start] ('('), blanks collapsed."""
    depth = 0
    for i in range(start, len(code)):
        if code[i] == '(':
            depth += 1
        elif code[i] == ')':
            depth -= 1
            if depth == 0:
                return ' '.join(code[start + 1:i].split()).lower()
    return None


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
        allowed = REPLACES.get(name, set())
        replaced = set()
        for m in CREATE_FUNCTION.finditer(code):
            fn = m.group(2).lower()
            args = arguments(code, m.end() - 1)
            if m.group(1) and fn in allowed:
                if fn not in seen:
                    bad.append('%s: replaces %s, which no earlier migration creates' % (name, fn))
                elif fn in replaced:
                    bad.append('%s: replaces %s twice' % (name, fn))
                elif args != seen[fn][1]:
                    bad.append('%s: replaces %s with other arguments (%s, first %s in %s)' %
                               (name, fn, args, seen[fn][1], seen[fn][0]))
                replaced.add(fn)
            elif fn in seen:
                bad.append('%s: function %s is created again (first in %s)' %
                           (name, fn, seen[fn][0]))
            else:
                seen[fn] = (name, args)
        for fn in sorted(allowed - replaced):
            bad.append('%s: REPLACES lists %s, which it does not replace' % (name, fn))
        dropped = set()
        rewritten = set()
        for m in REWRITE.finditer(code):
            r = REPLACE_FUNCTION.match(code, m.start())
            if r and r.group(1).lower() in allowed:
                continue
            stmt = ' '.join(code[m.start():code.find(';', m.start())].split()).lower()
            if stmt in DROPS.get(name, set()) | ALTERS.get(name, set()):
                dropped.add(stmt)
                continue
            prefix = [w for w in REWRITES.get(name, set()) if stmt.startswith(w)]
            if prefix:
                rewritten.add(prefix[0])
                continue
            line = code.count('\n', 0, m.start()) + 1
            bad.append('%s:%d: %s: the series creates each object once, in its final shape' %
                       (name, line, m.group(0).strip()))
        for stmt in sorted(DROPS.get(name, set()) - dropped):
            bad.append('%s: DROPS lists "%s", which it does not run' % (name, stmt))
        for stmt in sorted(ALTERS.get(name, set()) - dropped):
            bad.append('%s: ALTERS lists "%s", which it does not run' % (name, stmt))
        for stmt in sorted(REWRITES.get(name, set()) - rewritten):
            bad.append('%s: REWRITES lists "%s", which it does not run' % (name, stmt))
    if bad:
        print('\n'.join(bad), file=sys.stderr)
        sys.exit(1)
    print('check-migrations: %d migrations, %d functions, each created once (%d replaced, '
          '%d objects dropped as listed)' % (len(files), len(seen),
                                             sum(len(v) for v in REPLACES.values()),
                                             sum(len(v) for v in DROPS.values())))


if __name__ == '__main__':
    main()
