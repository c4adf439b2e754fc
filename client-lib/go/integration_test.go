package pgcoord

// Integration tests: a real agent (PGCOORD_TEST_AGENT_BIN) on a real
// PostgreSQL cluster given by tests/harness/with-postgres. Skipped when
// not run under it (plain `go test` on a developer machine).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type testAgent struct {
	t      *testing.T
	db     string
	socket string
	cmd    *exec.Cmd
}

func needEnv(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("%s is not set: run under tests/harness/with-postgres (meson test go-client)", name)
	}
	return v
}

func conninfo(db, user string) string {
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s", os.Getenv("PGCOORD_TEST_PGHOST"),
		os.Getenv("PGCOORD_TEST_PGPORT"), user, db)
}

// psql runs sql as the owner and returns the one value it printed.
func (a *testAgent) psql(sql string) string {
	return psqlOn(a.t, a.db, sql)
}

func psqlOn(t *testing.T, db, sql string) string {
	t.Helper()
	out, err := exec.Command("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
		"-d", conninfo(db, os.Getenv("PGCOORD_TEST_PGUSER")), "-c", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql %q: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// startAgent creates a database, migrates it as the owner and starts one
// agent on it as the runtime role. Everything goes at the test's end.
func startAgent(t *testing.T, extra ...string) *testAgent {
	bin := needEnv(t, "PGCOORD_TEST_AGENT_BIN")
	needEnv(t, "PGCOORD_TEST_PGHOST")
	role := needEnv(t, "PGCOORD_TEST_RUNTIME_ROLE")
	a := &testAgent{t: t, db: fmt.Sprintf("go_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)}
	psqlOn(t, "postgres", fmt.Sprintf(`CREATE DATABASE "%s"`, a.db))
	t.Cleanup(func() { psqlOn(t, "postgres", fmt.Sprintf(`DROP DATABASE IF EXISTS "%s" WITH (FORCE)`, a.db)) })
	out, err := exec.Command(bin, "migrate", "--database-url",
		conninfo(a.db, os.Getenv("PGCOORD_TEST_PGUSER")), "--runtime-role", role).CombinedOutput()
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	// A short directory: a socket path must fit in sun_path. Under the
	// harness's dir, so its cleanup finds the agent whatever happens.
	dir, err := os.MkdirTemp(os.Getenv("PGCOORD_TEST_TMP"), "go")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a.socket = filepath.Join(dir, "agent.sock")
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--database-url", conninfo(a.db, role), "--replica-id", "go-" + t.Name(),
		"--socket-path", a.socket}, extra...)
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = log, log
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cmd.Process.Signal(syscall.SIGCONT)
		a.cmd.Process.Kill()
		a.cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("agent log:\n%s", b)
		}
	})
	// Serving once agent.status says so (it registers with the database first).
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := Dial(ctx, a.socket, nil)
		if err == nil {
			st, err := c.Status(ctx)
			c.Close()
			if err == nil && st.State == "serving" && st.Registered {
				cancel()
				return a
			}
		}
		cancel()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the agent did not start serving in 15 s")
	return nil
}

func (a *testAgent) client(ctx context.Context, session bool) *Client {
	c, err := Dial(ctx, a.socket, &Options{ClientName: "go-test"})
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { c.Close() })
	if session {
		if _, err := c.SessionOpen(ctx, "go-test"); err != nil {
			a.t.Fatal(err)
		}
	}
	return c
}

func TestIntegrationPermits(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := a.client(ctx, true)
	if _, err := c.QuotaSet(ctx, "tenant-a", 1, nil); err != nil {
		t.Fatal(err)
	}
	r, err := c.PermitClaim(ctx, "job-1", []QuotaWeight{{Key: "tenant-a"}}, &ClaimOptions{Intent: []byte("run job 1")})
	if err != nil || r.Status != "admitted" || !r.Mine {
		t.Fatalf("claim: %+v %v", r, err)
	}
	again, err := c.PermitClaim(ctx, "job-1", []QuotaWeight{{Key: "tenant-a"}}, &ClaimOptions{Intent: []byte("run job 1")})
	if err != nil || again.Status != "held" || again.Token != r.Token {
		t.Fatalf("retry of the same id: %+v %v", again, err)
	}
	d, err := c.PermitClaim(ctx, "job-2", []QuotaWeight{{Key: "tenant-a"}}, nil)
	if err != nil || d.Status != "denied" || d.InFlight != 1 || d.Limit != 1 {
		t.Fatalf("claim past the limit: %+v %v", d, err)
	}
	if got := a.psql(`SELECT in_flight FROM pgcoord.quotas WHERE key = 'tenant-a'`); got != "1" {
		t.Fatalf("in_flight in the database: %s", got)
	}
	p, err := c.PermitGet(ctx, "job-1")
	if err != nil || string(p.Intent) != "run job 1" || p.State != "held" {
		t.Fatalf("permit.get: %+v %v", p, err)
	}
	if _, err := c.PermitUpdate(ctx, "job-1", "dispatched"); err != nil {
		t.Fatal(err)
	}
	rel, err := c.PermitRelease(ctx, "job-1", nil)
	if err != nil || !rel.Released {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if got := a.psql(`SELECT in_flight FROM pgcoord.quotas WHERE key = 'tenant-a'`); got != "0" {
		t.Fatalf("in_flight after release: %s", got)
	}
	if _, err := c.PermitClaim(ctx, "job-1", []QuotaWeight{{Key: "tenant-a"}}, nil); !errors.Is(err, ErrConflict) {
		t.Fatalf("claim of a released id: %v, want conflict", err)
	}
	if _, err := c.PermitClaim(ctx, "job-3", []QuotaWeight{{Key: "nope"}}, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown quota: %v", err)
	}
	if err := c.Call(ctx, "no.such", nil, nil); !errors.Is(err, ErrMethodNotFound) {
		t.Fatalf("unknown method: %v", err)
	}
	if err := c.Call(ctx, "permit.get", map[string]interface{}{"id": 5}, nil); !errors.Is(err, ErrInvalidParams) {
		t.Fatalf("wrong type: %v", err)
	}
	chk, err := c.PermitCheck(ctx)
	if err != nil || !chk.OK {
		t.Fatalf("check: %+v %v", chk, err)
	}
}

// A claim whose outcome was not seen and is given up releases its id: a
// late attempt can no longer take a slot, and the database says retired.
func TestIntegrationGiveUpRetires(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := a.client(ctx, true)
	if _, err := c.QuotaSet(ctx, "q", 5, nil); err != nil {
		t.Fatal(err)
	}
	// Hold the quota row so the claim waits inside the database.
	lock := exec.Command("psql", "-X", "-q", "-d", conninfo(a.db, os.Getenv("PGCOORD_TEST_PGUSER")),
		"-c", "BEGIN; SELECT 1 FROM pgcoord.quotas WHERE key = 'q' FOR UPDATE; SELECT pg_sleep(2); COMMIT;")
	if err := lock.Start(); err != nil {
		t.Fatal(err)
	}
	defer lock.Wait()
	// The row is locked once the locker sleeps inside its transaction.
	for a.psql(`SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep%' AND wait_event = 'PgSleep'`) != "1" {
		if ctx.Err() != nil {
			t.Fatal("the locker never took the quota row")
		}
		time.Sleep(20 * time.Millisecond)
	}
	short, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.PermitClaim(short, "late", []QuotaWeight{{Key: "q"}}, nil)
	scancel()
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("claim given up: %v, want ErrOutcomeUnknown", err)
	}
	lock.Wait()
	if got := a.psql(`SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'`); got != "0" {
		t.Fatalf("the given-up claim keeps a slot: in_flight %s", got)
	}
	if got := a.psql(`SELECT state FROM pgcoord.permits WHERE id = 'late'`); got != "released" {
		t.Fatalf("permit 'late' is %q, want released", got)
	}
}

func TestIntegrationElectAndFreeze(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c1, c2 := a.client(ctx, true), a.client(ctx, true)
	opts := &LeaseOptions{TTL: 2 * time.Second}
	lead, resign, err := c1.Elect(ctx, "reconciler", opts)
	if err != nil {
		t.Fatal(err)
	}
	if !c1.IsLeader("reconciler") {
		t.Fatal("Elect returned without belief")
	}
	for won := false; !won; {
		select {
		case n := <-c1.Notifications():
			won = n.Method == "lease.changed" && n.Params["name"] == "reconciler" && n.Params["leader"] == true
		case <-time.After(3 * time.Second):
			t.Fatal("no lease.changed on the notification channel")
		}
	}
	if got := a.psql(`SELECT holder_session FROM pgcoord.leases WHERE name = 'reconciler'`); got != fmt.Sprint(c1.Session()) {
		t.Fatalf("holder in the database %s, want session %d", got, c1.Session())
	}
	short, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, _, err := c2.Elect(short, "reconciler", opts); err == nil {
		t.Fatal("a second leader")
	}
	scancel()
	// Renewals keep the leadership past one ttl.
	time.Sleep(2500 * time.Millisecond)
	if lead.Err() != nil || !c1.IsLeader("reconciler") {
		t.Fatal("leadership ended while the agent renewed it")
	}
	resign()
	if c1.IsLeader("reconciler") || lead.Err() == nil {
		t.Fatal("belief survived the resignation")
	}
	lead2, resign2, err := c2.Elect(ctx, "reconciler", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer resign2()
	// Freeze the agent: no renewal, no notification. The leadership
	// must end before the row can expire for anyone else.
	var expiresMs int64
	fmt.Sscan(a.psql(`SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM pgcoord.leases WHERE name = 'reconciler'`), &expiresMs)
	frozen := time.Now()
	a.cmd.Process.Signal(syscall.SIGSTOP)
	select {
	case <-lead2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("leadership outlived a frozen agent")
	}
	ended := time.Since(frozen)
	a.cmd.Process.Signal(syscall.SIGCONT)
	if ended >= time.Duration(expiresMs)*time.Millisecond || ended >= 2*time.Second {
		t.Fatalf("leadership ended %v after the freeze; the row could expire after %d ms", ended, expiresMs)
	}
}

func TestIntegrationResume(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := a.client(ctx, true)
	id := c.Session()
	c.mu.Lock()
	cn := c.cn
	c.mu.Unlock()
	cn.close()
	k, err := c.SessionKeepalive(ctx)
	if err != nil || k.Session != id {
		t.Fatalf("keepalive after reconnect: %+v %v (session %d)", k, err, id)
	}
	if got := a.psql(fmt.Sprintf(`SELECT count(*) FROM pgcoord.sessions WHERE id = %d AND closed_at IS NULL`, id)); got != "1" {
		t.Fatal("the resumed session is closed in the database")
	}
	if err := c.SessionClose(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.psql(fmt.Sprintf(`SELECT count(*) FROM pgcoord.sessions WHERE id = %d AND closed_at IS NOT NULL`, id)); got != "1" {
		t.Fatal("session.close left the session open")
	}
	if _, err := c.SessionKeepalive(ctx); !errors.Is(err, ErrNoSession) {
		t.Fatalf("keepalive without a session: %v", err)
	}
}

// The example does real work: permit-cycle prints its JSON, replicas run
// jobs on shared quotas, and a later replica recovers what an earlier one
// left open.
func TestIntegrationExampleScheduler(t *testing.T) {
	a := startAgent(t)
	bin := filepath.Join(t.TempDir(), "scheduler")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/scheduler").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-socket", a.socket, "permit-cycle", "-id", "pc-1", "-quota", "smoke").Output()
	if err != nil {
		t.Fatalf("permit-cycle: %v", err)
	}
	var pc struct {
		Claim   map[string]interface{} `json:"claim"`
		Release map[string]interface{} `json:"release"`
	}
	if err := json.Unmarshal(out, &pc); err != nil || pc.Claim["status"] != "admitted" || pc.Release["released"] != true {
		t.Fatalf("permit-cycle printed %s (%v)", out, err)
	}
	if got := a.psql(`SELECT state FROM pgcoord.permits WHERE id = 'pc-1'`); got != "released" {
		t.Fatalf("pc-1 is %q in the database", got)
	}

	// A replica whose connector drops every job leaves them open...
	if out, err := exec.Command(bin, "-socket", a.socket, "run", "-jobs", "4", "-drop", "1",
		"-name", "r1").CombinedOutput(); err != nil {
		t.Fatalf("run r1: %v\n%s", err, out)
	}
	if got := a.psql(`SELECT count(*) FROM pgcoord.records WHERE kind = 'job' AND settled_at IS NULL`); got != "4" {
		t.Fatalf("open jobs after r1: %s", got)
	}
	// ...and its successor adopts and settles them, then runs its own.
	if out, err := exec.Command(bin, "-socket", a.socket, "run", "-jobs", "2", "-drop", "0",
		"-name", "r2").CombinedOutput(); err != nil {
		t.Fatalf("run r2: %v\n%s", err, out)
	}
	if got := a.psql(`SELECT count(*) FROM pgcoord.records WHERE kind = 'job' AND state = 'abandoned' AND adopted_from IS NOT NULL`); got != "4" {
		t.Fatalf("jobs recovered by r2: %s", got)
	}
	if got := a.psql(`SELECT count(*) FROM pgcoord.records WHERE kind = 'job' AND state = 'done'`); got != "2" {
		t.Fatalf("jobs done by r2: %s", got)
	}
	if got := a.psql(`SELECT coalesce(sum(in_flight), -1) FROM pgcoord.quotas WHERE key LIKE 'tenant-%'`); got != "0" {
		t.Fatalf("tenant slots still taken: %s", got)
	}

	// A predecessor that dies while a replica is already at work: the
	// replica takes its job when the owner dies, not only at boot.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	late := a.client(ctx, true)
	if _, _, err := late.RecordPut(ctx, "job", "late-job", "dispatched", nil, ""); err != nil {
		t.Fatal(err)
	}
	r3 := exec.CommandContext(ctx, bin, "-socket", a.socket, "run", "-jobs", "1", "-drop", "0", "-name", "r3", "-stay")
	var r3log strings.Builder
	r3.Stdout, r3.Stderr = &r3log, &r3log
	if err := r3.Start(); err != nil {
		t.Fatal(err)
	}
	// r3 recovers at boot before its first job: once that is done, the
	// late predecessor dies after r3's boot recovery.
	waitSQL(t, a, `SELECT count(*) FROM pgcoord.records WHERE key LIKE 'job-r3-%' AND state = 'done'`, "1")
	if err := late.SessionClose(ctx); err != nil {
		t.Fatal(err)
	}
	waitSQL(t, a, `SELECT s.name || ' ' || r.state FROM pgcoord.records r JOIN pgcoord.sessions s
		ON s.id = r.owner_session WHERE r.key = 'late-job' AND r.terminal`, "r3 abandoned")
	r3.Process.Signal(syscall.SIGTERM)
	if err := r3.Wait(); err != nil {
		t.Fatalf("run r3: %v\n%s", err, r3log.String())
	}
	if got := a.psql(`SELECT count(*) FROM pgcoord.record_events WHERE key = 'late-job' AND event = 'adopt'`); got != "1" {
		t.Fatalf("late-job adopted %s times", got)
	}
}

// waitSQL waits for sql to answer want, for at most 30 s: a bound on a
// hang, not a guess at how long anything takes.
func waitSQL(t *testing.T, a *testAgent, sql, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := a.psql(sql); got != want; got = a.psql(sql) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q, not %q after 30 s", sql, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A reply lost with its connection: the client reconnects, resumes the
// session and retries the same id, which finds the first attempt's permit
// (held) or, had that one not committed, takes the slot itself: one slot.
func TestIntegrationLostReplyThenRetry(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := a.client(ctx, true)
	if _, err := c.QuotaSet(ctx, "q", 5, nil); err != nil {
		t.Fatal(err)
	}
	lock := exec.Command("psql", "-X", "-q", "-d", conninfo(a.db, os.Getenv("PGCOORD_TEST_PGUSER")),
		"-c", "BEGIN; SELECT 1 FROM pgcoord.quotas WHERE key = 'q' FOR UPDATE; SELECT pg_sleep(1.5); COMMIT;")
	if err := lock.Start(); err != nil {
		t.Fatal(err)
	}
	defer lock.Wait()
	for a.psql(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`) != "1" {
		time.Sleep(20 * time.Millisecond)
	}
	type result struct {
		r   *Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.PermitClaim(ctx, "lost-reply", []QuotaWeight{{Key: "q"}}, nil)
		done <- result{r, err}
	}()
	// The claim waits for the row inside the database; cut its connection.
	for a.psql(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`) == "0" {
		time.Sleep(20 * time.Millisecond)
	}
	session := c.Session()
	c.mu.Lock()
	cn := c.cn
	c.mu.Unlock()
	cn.close()
	res := <-done
	if res.err != nil || !res.r.Admitted() || !res.r.Mine || res.r.Attempts < 2 {
		t.Fatalf("claim after a lost reply: %+v %v", res.r, res.err)
	}
	if c.Session() != session {
		t.Fatalf("session %d after the reconnect, want %d resumed", c.Session(), session)
	}
	if got := a.psql(`SELECT in_flight FROM pgcoord.quotas WHERE key = 'q'`); got != "1" {
		t.Fatalf("in_flight %s, want 1: the retry must not take a second slot", got)
	}
}

// A quota watch pushes the current state first, then each change; the
// release through another session frees the room the watcher hears of.
func TestIntegrationQuotaWatch(t *testing.T) {
	a := startAgent(t, "--watch-poll-ms", "100")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worker, watcher := a.client(ctx, true), a.client(ctx, true)
	if _, err := worker.QuotaSet(ctx, "gpu", 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.PermitClaim(ctx, "job-1", []QuotaWeight{{Key: "gpu"}}, nil); err != nil {
		t.Fatal(err)
	}
	w, err := watcher.QuotaWatch(ctx, "gpu")
	if err != nil || w.ID <= 0 || w.PollMs != 100 {
		t.Fatalf("quota.watch: %+v %v", w, err)
	}
	next := func() map[string]interface{} {
		for {
			select {
			case n := <-watcher.Notifications():
				if n.Method == "quota.changed" {
					return n.Params
				}
			case <-ctx.Done():
				t.Fatal("no quota.changed")
			}
		}
	}
	if p := next(); fmt.Sprint(p["room"]) != "0" || fmt.Sprint(p["in_flight"]) != "1" {
		t.Fatalf("first quota.changed: %v", p)
	}
	if _, err := worker.PermitRelease(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	if p := next(); fmt.Sprint(p["room"]) != "1" || fmt.Sprint(p["watch"]) != fmt.Sprint(w.ID) {
		t.Fatalf("quota.changed after the release: %v", p)
	}
	if got := a.psql(`SELECT in_flight FROM pgcoord.quotas WHERE key = 'gpu'`); got != "0" {
		t.Fatalf("in_flight after release: %s", got)
	}
	if ok, err := watcher.WatchCancel(ctx, w.ID); err != nil || !ok {
		t.Fatalf("watch.cancel: %v %v", ok, err)
	}
	if ok, err := watcher.WatchCancel(ctx, w.ID); err != nil || ok {
		t.Fatalf("second watch.cancel: %v %v", ok, err)
	}
}

// Options.Keepalive: a client that calls SessionKeepalive keeps its
// session; one that stops is told session.lost "keepalive missed", its
// calls answer session_expired and the database stops renewing the row.
func TestIntegrationKeepalive(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, a.socket, &Options{ClientName: "go-test", Keepalive: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.SessionOpen(ctx, "go-keepalive")
	if err != nil || info.KeepaliveMs != 400 {
		t.Fatalf("session.open: %+v %v", info, err)
	}
	id := info.Session
	for i := 0; i < 10; i++ { // 1.5 s: well past keepalive_ms
		k, err := c.SessionKeepalive(ctx)
		if err != nil || k.KeepaliveMs != 400 || k.NextDueMs <= 0 || k.NextDueMs > 400 {
			t.Fatalf("keepalive %d: %+v %v", i, k, err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	// the application stops: the agent notices by itself
	var reason interface{}
	timeout := time.After(5 * time.Second)
	for reason == nil {
		select {
		case n := <-c.Notifications():
			if n.Method == "session.lost" {
				reason = n.Params["reason"]
			}
		case <-timeout:
			t.Fatal("no session.lost after the keepalives stopped")
		}
	}
	if reason != "keepalive missed" {
		t.Fatalf("session.lost reason %v", reason)
	}
	if _, err := c.SessionKeepalive(ctx); !errors.Is(err, ErrSessionExpired) && !errors.Is(err, ErrNoSession) {
		t.Fatalf("keepalive of a lost session: %v", err)
	}
	// no longer renewed: the row expires within session_ttl_ms
	deadline := time.Now().Add(15 * time.Second)
	for a.psql(fmt.Sprintf(`SELECT count(*) FROM pgcoord.live_sessions WHERE id = %d`, id)) != "0" {
		if time.Now().After(deadline) {
			t.Fatal("the lost session is still renewed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// a bad value is the agent's invalid_params
	bad, err := Dial(ctx, a.socket, &Options{Keepalive: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.SessionOpen(ctx, "go-bad"); !errors.Is(err, ErrInvalidParams) {
		t.Fatalf("keepalive 50ms: %v", err)
	}
}

// Waiting claims: queued then admitted when the slot is freed, expired
// when wait_ms runs out, cancelled by the caller; the database agrees.
func TestIntegrationClaimWait(t *testing.T) {
	a := startAgent(t, "--wait-poll-ms", "50")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, waiter := a.client(ctx, true), a.client(ctx, true)
	q := []QuotaWeight{{Key: "wq"}}
	if _, err := holder.QuotaSet(ctx, "wq", 1, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := holder.PermitClaim(ctx, "w-holder", q, nil); err != nil || r.Status != "admitted" {
		t.Fatalf("claim: %+v %v", r, err)
	}
	queued := func(id string) string {
		return a.psql(fmt.Sprintf(`SELECT count(*) FROM pgcoord.waiters WHERE id = '%s' AND state = 'queued'`, id))
	}

	// Queued, then admitted when the holder releases.
	type outcome struct {
		r   *Claim
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := waiter.ClaimWait(ctx, "w-1", q, &ClaimOptions{WaitMs: 20000})
		done <- outcome{r, err}
	}()
	for queued("w-1") != "1" {
		if ctx.Err() != nil {
			t.Fatal("w-1 never queued")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r, err := holder.PermitClaim(ctx, "w-2", q, &ClaimOptions{WaitMs: 20000}); err != nil ||
		r.Status != "queued" || r.Position != 2 || r.DeadlineAt <= r.QueuedAt {
		t.Fatalf("a second waiter: %+v %v", r, err)
	}
	if c, err := holder.PermitCancel(ctx, "w-2"); err != nil || !c.Cancelled || c.Status != "cancelled" {
		t.Fatalf("permit.cancel of a queued claim: %+v %v", c, err)
	}
	if _, err := holder.PermitRelease(ctx, "w-holder", nil); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || o.r.Status != "admitted" || o.r.Token == 0 || o.r.OwnerSession != waiter.Session() {
		t.Fatalf("the wait: %+v %v", o.r, o.err)
	}
	want := fmt.Sprintf("held|%d", waiter.Session())
	if got := a.psql(`SELECT state || '|' || owner_session FROM pgcoord.permits WHERE id = 'w-1'`); got != want {
		t.Fatalf("w-1 in the database: %s, want %s", got, want)
	}

	// Expired: nothing remains, and the id is free again.
	if _, err := waiter.ClaimWait(ctx, "w-3", q, &ClaimOptions{WaitMs: 200}); !errors.Is(err, ErrWaitExpired) {
		t.Fatalf("a wait past wait_ms: %v", err)
	}
	if got := a.psql(`SELECT count(*) FROM pgcoord.permits WHERE id = 'w-3'`); got != "0" || queued("w-3") != "0" {
		t.Fatalf("an expired claim left a permit (%s) or a waiter (%s)", got, queued("w-3"))
	}

	// Cancelled by the caller: out of the queue, and the slot freed later
	// is not handed to it.
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	if _, err := holder.ClaimWait(wctx, "w-4", q, &ClaimOptions{WaitMs: 20000}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a given-up wait: %v", err)
	}
	if queued("w-4") != "0" {
		t.Fatal("a given-up wait is still queued")
	}
	if _, err := waiter.PermitRelease(ctx, "w-1", nil); err != nil {
		t.Fatal(err)
	}
	if got := a.psql(`SELECT in_flight || '|' || (SELECT count(*) FROM pgcoord.permits WHERE id = 'w-4')
		FROM pgcoord.quotas WHERE key = 'wq'`); got != "0|0" {
		t.Fatalf("in_flight|permits of w-4 after the release: %s", got)
	}
	if chk, err := holder.PermitCheck(ctx); err != nil || !chk.OK {
		t.Fatalf("check: %+v %v", chk, err)
	}
}
