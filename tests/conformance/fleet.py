"""Real agents on a real database for the Python runners: a database in the
cluster tests/harness/with-postgres started, migrated by the owner with
--runtime-role, agents run as the runtime role (as tests/harness/harness.c
does), psql for asserting on database state, and a Unix-socket proxy that
can lose a reply or cut connections."""

from __future__ import annotations

import itertools
import os
import secrets
import select
import signal
import socket
import subprocess
import threading
import time

import msgpack


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        raise SystemExit(f"{name} is not set: run under tests/harness/with-postgres "
                         "with PGCOORD_TEST_AGENT_BIN pointing at pgcoord-agent")
    return v


def _conninfo(dbname: str, user: str) -> str:
    bouncer = os.environ.get("PGCOORD_TEST_PGBOUNCER_HOST")
    host = bouncer or env("PGCOORD_TEST_PGHOST")
    port = os.environ["PGCOORD_TEST_PGBOUNCER_PORT"] if bouncer else env("PGCOORD_TEST_PGPORT")
    return f"host='{host}' port='{port}' user='{user}' dbname='{dbname}'"


class Database:
    """A fresh database, migrated; dropped by close()."""

    _serial = itertools.count(1)

    def __init__(self):
        self.name = f"py_{os.getpid()}_{next(self._serial)}_{secrets.token_hex(3)}"
        self.psql(f'CREATE DATABASE "{self.name}"', db="postgres")
        self.owner_conninfo = _conninfo(self.name, env("PGCOORD_TEST_PGUSER"))
        self.agent_conninfo = _conninfo(self.name, env("PGCOORD_TEST_RUNTIME_ROLE"))
        r = subprocess.run([env("PGCOORD_TEST_AGENT_BIN"), "migrate", "--database-url",
                            self.owner_conninfo, "--runtime-role",
                            env("PGCOORD_TEST_RUNTIME_ROLE")],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"pgcoord-agent migrate exited {r.returncode}: {r.stderr}")

    def psql(self, sql: str, db: str | None = None) -> list[list[str]]:
        """Rows of sql (run as the owner, straight to the server), as text."""
        r = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                            "-h", env("PGCOORD_TEST_PGHOST"), "-p", env("PGCOORD_TEST_PGPORT"),
                            "-U", env("PGCOORD_TEST_PGUSER"), "-d", db or self.name, "-c", sql],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}\n  query: {sql}")
        return [line.split("\t") for line in r.stdout.splitlines() if line != ""]

    def hold(self, sql: str) -> "HeldTransaction":
        return HeldTransaction(self, sql)

    def close(self) -> None:
        self.psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)', db="postgres")


class HeldTransaction:
    """A transaction left open (say, holding a row lock) until release()."""

    def __init__(self, db: Database, sql: str):
        self.proc = subprocess.Popen(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", env("PGCOORD_TEST_PGHOST"),
             "-p", env("PGCOORD_TEST_PGPORT"), "-U", env("PGCOORD_TEST_PGUSER"), "-d", db.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.proc.stdin.write(f"BEGIN;\n{sql};\n\\echo held\n")
        self.proc.stdin.flush()
        # Wait until the lock is really taken (the query's rows come first).
        seen = []
        for line in self.proc.stdout:
            if line.strip() == "held":
                return
            seen.append(line)
        raise RuntimeError(f"could not hold {sql!r}: {''.join(seen)}")

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("ROLLBACK;\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


class Agent:
    """One pgcoord-agent process serving a socket of its own."""

    def __init__(self, db: Database, replica_id: str, tmp: str, extra: list[str] = ()):
        self.replica_id = replica_id
        self.socket_path = os.path.join(tmp, f"{replica_id}.sock")
        self.log_path = os.path.join(tmp, f"{replica_id}.log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [env("PGCOORD_TEST_AGENT_BIN"), "--database-url", db.agent_conninfo,
                 "--replica-id", replica_id, "--socket-path", self.socket_path, *extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._wait_registered()

    def _wait_registered(self, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.replica_id} exited {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                if raw_call(self.socket_path, "agent.status").get("registered") is True:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"agent {self.replica_id} not registered in time:\n" + self.log_tail())

    def log_tail(self, n: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def raw_call(path: str, method: str, params: dict | None = None, timeout: float = 2.0) -> dict:
    """One call on a fresh connection; the result map (or the error map)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(msgpack.packb([0, 1, method, [params] if params else []]))
        u = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            if not data:
                raise OSError("closed")
            u.feed(data)
            for m in u:
                if m[0] == 1:
                    return m[3] if m[2] is None else m[2]


class Proxy:
    """Listens on a socket of its own and relays each connection to the
    agent. drop_reply(method) makes it swallow the reply to the next request
    of that method and cut the connection (a reply lost on the way back);
    cut() closes every connection it relays."""

    def __init__(self, agent_path: str, path: str):
        self.agent_path, self.path = agent_path, path
        self._drop_method: str | None = None
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.dropped = 0
        self._lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lsock.bind(path)
        self._lsock.listen(16)
        self._stop = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def drop_reply(self, method: str) -> None:
        with self._lock:
            self._drop_method = method

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._lsock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                c, _ = self._lsock.accept()
            except OSError:
                return
            a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                a.connect(self.agent_path)
            except OSError:
                c.close()
                continue
            with self._lock:
                self._pairs.append((c, a))
            threading.Thread(target=self._relay, args=(c, a), daemon=True).start()

    def _relay(self, c: socket.socket, a: socket.socket) -> None:
        up, down = msgpack.Unpacker(raw=False), msgpack.Unpacker(raw=False)
        doomed: set[int] = set()
        try:
            while True:
                r, _, _ = select.select([c, a], [], [])
                if c in r:
                    data = c.recv(65536)
                    if not data:
                        break
                    up.feed(data)
                    for m in up:
                        with self._lock:
                            if self._drop_method and m[2] == self._drop_method:
                                doomed.add(m[1])
                                self._drop_method = None
                    a.sendall(data)
                if a in r:
                    data = a.recv(65536)
                    if not data:
                        break
                    down.feed(data)
                    out = b""
                    for m in down:
                        if m[0] == 1 and m[1] in doomed:
                            # Lost on the way back: the client never sees it.
                            self.dropped += 1
                            raise ConnectionAbortedError
                        out += msgpack.packb(m, use_bin_type=True)
                    if out:
                        c.sendall(out)
        except OSError:
            pass
        finally:
            for s in (c, a):
                try:
                    s.close()
                except OSError:
                    pass
