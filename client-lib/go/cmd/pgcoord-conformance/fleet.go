package main

// What the runner stands on (as tests/conformance/fleet.py for Python): a
// fresh database migrated by the owner, agents run as the runtime role,
// psql for asserting on database state and for holding row locks.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	pgcoord "pgcoord.dev/pgcoord"
)

func env(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "%s is not set: run under tests/harness/with-postgres "+
			"with PGCOORD_TEST_AGENT_BIN pointing at pgcoord-agent\n", name)
		os.Exit(2)
	}
	return v
}

// conninfo goes through PgBouncer when the harness runs one.
func conninfo(db, user string) string {
	host, port := env("PGCOORD_TEST_PGHOST"), env("PGCOORD_TEST_PGPORT")
	if b := os.Getenv("PGCOORD_TEST_PGBOUNCER_HOST"); b != "" {
		host, port = b, os.Getenv("PGCOORD_TEST_PGBOUNCER_PORT")
	}
	return fmt.Sprintf("host='%s' port='%s' user='%s' dbname='%s'", host, port, user, db)
}

type database struct{ name string }

func psqlArgs(db string) []string {
	return []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", env("PGCOORD_TEST_PGHOST"),
		"-p", env("PGCOORD_TEST_PGPORT"), "-U", env("PGCOORD_TEST_PGUSER"), "-d", db}
}

// psql runs sql as the owner, straight to the server; rows as text.
func psql(db, sql string) ([][]string, error) {
	args := append(psqlArgs(db), "-A", "-t", "-F", "\t", "-c", sql)
	cmd := exec.Command("psql", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("psql failed: %v: %s\n  query: %s", err, strings.TrimSpace(stderr.String()), sql)
	}
	rows := [][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" {
			rows = append(rows, strings.Split(line, "\t"))
		}
	}
	return rows, nil
}

func newDatabase() (*database, error) {
	db := &database{name: fmt.Sprintf("goconf_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)}
	if _, err := psql("postgres", fmt.Sprintf(`CREATE DATABASE "%s"`, db.name)); err != nil {
		return nil, err
	}
	out, err := exec.Command(env("PGCOORD_TEST_AGENT_BIN"), "migrate", "--database-url",
		conninfo(db.name, env("PGCOORD_TEST_PGUSER")), "--runtime-role",
		env("PGCOORD_TEST_RUNTIME_ROLE")).CombinedOutput()
	if err != nil {
		db.close()
		return nil, fmt.Errorf("pgcoord-agent migrate: %v: %s", err, out)
	}
	return db, nil
}

func (db *database) close() {
	psql("postgres", fmt.Sprintf(`DROP DATABASE IF EXISTS "%s" WITH (FORCE)`, db.name))
}

// heldTx is a transaction left open (holding its row locks) until release.
type heldTx struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func (db *database) hold(sql string) (*heldTx, error) {
	cmd := exec.Command("psql", psqlArgs(db.name)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &heldTx{cmd: cmd, stdin: stdin}
	fmt.Fprintf(stdin, "BEGIN;\n%s;\n\\echo held\n", sql)
	// The lock is taken once the echo after the query comes back.
	sc := bufio.NewScanner(stdout)
	var seen []string
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "held" {
			go io.Copy(io.Discard, stdout)
			return h, nil
		}
		seen = append(seen, sc.Text())
	}
	h.release()
	return nil, fmt.Errorf("could not hold %q: %s", sql, strings.Join(seen, "\n"))
}

func (h *heldTx) release() {
	if h.stdin != nil {
		io.WriteString(h.stdin, "ROLLBACK;\n")
		h.stdin.Close()
		h.stdin = nil
		h.cmd.Wait()
	}
}

// agent is one pgcoord-agent process serving a socket of its own.
type agent struct {
	replicaID string
	socket    string
	logPath   string
	cmd       *exec.Cmd
	exited    chan struct{}
}

func startAgent(db *database, replicaID, dir string, extra []string) (*agent, error) {
	a := &agent{replicaID: replicaID, socket: filepath.Join(dir, replicaID+".sock"),
		logPath: filepath.Join(dir, replicaID+".log"), exited: make(chan struct{})}
	log, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := append([]string{"--database-url", conninfo(db.name, env("PGCOORD_TEST_RUNTIME_ROLE")),
		"--replica-id", replicaID, "--socket-path", a.socket}, extra...)
	a.cmd = exec.Command(env("PGCOORD_TEST_AGENT_BIN"), args...)
	a.cmd.Stdout, a.cmd.Stderr = log, log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { a.cmd.Wait(); close(a.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-a.exited:
			return nil, fmt.Errorf("agent %s exited: %s\n%s", replicaID, a.cmd.ProcessState, a.logTail())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgcoord.Dial(ctx, a.socket, nil)
		if err == nil {
			st, err := c.Status(ctx)
			c.Close()
			if err == nil && st.Registered {
				cancel()
				return a, nil
			}
		}
		cancel()
		time.Sleep(50 * time.Millisecond)
	}
	a.stop()
	return nil, fmt.Errorf("agent %s not registered in time:\n%s", replicaID, a.logTail())
}

func (a *agent) logTail() string {
	b, _ := os.ReadFile(a.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

func (a *agent) signal(sig syscall.Signal) error { return a.cmd.Process.Signal(sig) }

func (a *agent) stop() {
	select {
	case <-a.exited:
		return
	default:
	}
	a.cmd.Process.Signal(syscall.SIGCONT)
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-a.exited
	}
}
