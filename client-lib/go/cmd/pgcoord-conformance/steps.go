package main

// One scenario's run: its agents, clients and proxies, and one method per
// op of tests/conformance/README.md.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	pgcoord "pgcoord.dev/pgcoord"
)

const (
	callTimeout = 5 * time.Second  // one call
	retryBudget = 10 * time.Second // a claim's or release's retries
)

var agentTimings = []string{"--heartbeat-interval-ms", "200", "--session-ttl-ms", "1500",
	"--lease-retry-ms", "100", "--janitor-interval-ms", "200"}

type step = map[string]interface{}

// background is a claim running concurrently until an await step.
type background struct {
	done chan struct{}
	err  error
}

type run struct {
	db          *database
	dir         string
	agents      map[string]*agent
	agentOrder  []string
	clients     map[string]*pgcoord.Client
	proxies     map[string]*proxy
	saved       map[string]interface{}
	held        *heldTx
	bg          map[string]*background
	beliefEnded map[string]time.Time // client + "\x00" + lease → first seen ended
}

var agentSerial int

func newRun(db *database, dir string, agentNames []string) (*run, error) {
	r := &run{db: db, dir: dir, agents: map[string]*agent{}, clients: map[string]*pgcoord.Client{},
		proxies: map[string]*proxy{}, saved: map[string]interface{}{}, bg: map[string]*background{},
		beliefEnded: map[string]time.Time{}}
	for _, name := range agentNames {
		agentSerial++
		a, err := startAgent(db, fmt.Sprintf("%s-%d-%d", name, os.Getpid(), agentSerial), dir, agentTimings)
		if err != nil {
			r.close()
			return nil, err
		}
		r.agents[name] = a
		r.agentOrder = append(r.agentOrder, name)
	}
	return r, nil
}

func (r *run) close() {
	for _, c := range r.clients {
		c.Close()
	}
	for _, p := range r.proxies {
		p.close()
	}
	if r.held != nil {
		r.held.release()
	}
	for _, b := range r.bg {
		select {
		case <-b.done:
		case <-time.After(60 * time.Second):
		}
	}
	for _, a := range r.agents {
		a.stop()
	}
}

func (r *run) step(s step) error {
	sub, err := substitute(s, r.saved)
	if err != nil {
		return err
	}
	s = sub.(step)
	op, _ := s["op"].(string)
	switch op {
	case "connect":
		return r.connect(s)
	case "open_session":
		return r.openSession(s)
	case "call":
		return r.call(s)
	case "claim":
		return r.claim(s)
	case "await":
		return r.await(s)
	case "release":
		return r.release(s)
	case "give_up":
		return r.giveUp(s)
	case "lease_acquire":
		return r.leaseAcquire(s)
	case "lease_release":
		return r.leaseRelease(s)
	case "expect_leader":
		return r.expectLeader(s)
	case "expect_session":
		return r.expectSession(s)
	case "sql":
		return r.sql(s)
	case "list_all":
		return r.listAll(s)
	case "sql_hold":
		h, err := r.db.hold(str(s, "query"))
		r.held = h
		return err
	case "sql_release":
		if r.held == nil {
			return errors.New("no transaction is held")
		}
		r.held.release()
		r.held = nil
		return nil
	case "signal":
		return r.signal(s)
	case "sleep":
		time.Sleep(time.Duration(num(s, "ms", 0)) * time.Millisecond)
		return nil
	case "proxy_drop_reply":
		p, ok := r.proxies[str(s, "client")]
		if !ok {
			return fmt.Errorf("client %s has no proxy", str(s, "client"))
		}
		p.dropReply(str(s, "method"))
		return nil
	case "proxy_cut":
		p, ok := r.proxies[str(s, "client")]
		if !ok {
			return fmt.Errorf("client %s has no proxy", str(s, "client"))
		}
		p.cut()
		return nil
	}
	return fmt.Errorf("unknown op %q", op)
}

func str(s step, k string) string { v, _ := s[k].(string); return v }

func num(s step, k string, def int64) int64 {
	if v, ok := s[k].(int64); ok {
		return v
	}
	return def
}

func (r *run) client(s step) (*pgcoord.Client, error) {
	c, ok := r.clients[str(s, "client")]
	if !ok {
		return nil, fmt.Errorf("no client %q connected", str(s, "client"))
	}
	return c, nil
}

// errCode is the step's view of an error: the agent's code, or gave_up
// for a claim that ran out of retries after an unknown outcome.
func errCode(err error) string {
	var e *pgcoord.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, pgcoord.ErrOutcomeUnknown) || strings.Contains(err.Error(), "gave up") {
		return "gave_up"
	}
	return err.Error()
}

// expectError judges err against the step's "error" (none expected when
// absent).
func expectError(s step, what string, err error) error {
	want, wantErr := s["error"].(string)
	switch {
	case err == nil && wantErr:
		return fmt.Errorf("%s: expected error %s, but it succeeded", what, want)
	case err != nil && !wantErr:
		return fmt.Errorf("%s: unexpected error: %v", what, err)
	case err != nil && errCode(err) != want:
		return fmt.Errorf("%s: expected error %s, got %v", what, want, err)
	}
	return nil
}

// asMap is a typed result as the map its msgpack tags describe.
func asMap(v interface{}) (map[string]interface{}, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]interface{}
	if err := msgpack.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return normalize(m).(map[string]interface{}), nil
}

func (r *run) save(s step, m map[string]interface{}) {
	spec, _ := s["save"].(map[string]interface{})
	for v, field := range spec {
		if f, ok := field.(string); ok {
			r.saved[v] = m[f]
		}
	}
}

func (r *run) connect(s step) error {
	a, ok := r.agents[str(s, "agent")]
	if !ok {
		return fmt.Errorf("no agent %q", str(s, "agent"))
	}
	path := a.socket
	if b, _ := s["proxy"].(bool); b {
		p, err := newProxy(path, filepath.Join(r.dir, "proxy-"+str(s, "client")+".sock"))
		if err != nil {
			return err
		}
		r.proxies[str(s, "client")] = p
		path = p.path
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := pgcoord.Dial(ctx, path, &pgcoord.Options{ClientName: "go-conformance"})
	if err != nil {
		return err
	}
	r.clients[str(s, "client")] = c
	return nil
}

func (r *run) openSession(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	info, err := c.SessionOpen(ctx, str(s, "name"))
	if err != nil {
		return err
	}
	if v, ok := s["save"].(string); ok {
		r.saved[v] = info.Session
	}
	return nil
}

func (r *run) call(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	params, _ := s["params"].(map[string]interface{})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var out interface{}
	err = c.Call(ctx, str(s, "method"), params, &out)
	if err := expectError(s, str(s, "method"), err); err != nil || s["error"] != nil {
		return err
	}
	got := normalize(out)
	if want, ok := s["result"]; ok {
		if err := match(want, got, str(s, "method")); err != nil {
			return err
		}
	}
	if m, ok := got.(map[string]interface{}); ok {
		r.save(s, m)
	}
	return nil
}

// doClaim is the library's claim with its retry rule; retry_ms is the
// context's budget (the Go client has no separate per-attempt timeout:
// each attempt waits within the same budget).
func (r *run) doClaim(c *pgcoord.Client, s step) (*pgcoord.Claim, error) {
	quotas, _ := s["quotas"].(map[string]interface{})
	keys := make([]string, 0, len(quotas))
	for k := range quotas {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	qs := make([]pgcoord.QuotaWeight, 0, len(keys))
	for _, k := range keys {
		w, _ := quotas[k].(int64)
		qs = append(qs, pgcoord.QuotaWeight{Key: k, Weight: w})
	}
	var opts pgcoord.ClaimOptions
	if l, ok := s["limit"].(int64); ok {
		opts.Limit = &l
	}
	ctx, cancel := context.WithTimeout(context.Background(),
		time.Duration(num(s, "retry_ms", retryBudget.Milliseconds()))*time.Millisecond)
	defer cancel()
	return c.PermitClaim(ctx, str(s, "id"), qs, &opts)
}

func (r *run) claim(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	if name, ok := s["background"].(string); ok {
		b := &background{done: make(chan struct{})}
		r.bg[name] = b
		go func() {
			defer close(b.done)
			_, b.err = r.doClaim(c, s)
		}()
		return nil
	}
	cl, err := r.doClaim(c, s)
	if err := expectError(s, "claim", err); err != nil || s["error"] != nil {
		return err
	}
	m, err := asMap(cl)
	if err != nil {
		return err
	}
	if want, ok := s["expect"].(map[string]interface{}); ok {
		if err := match(want, m, "claim"); err != nil {
			return err
		}
		if least, ok := want["$attempts_at_least"].(int64); ok && int64(cl.Attempts) < least {
			return fmt.Errorf("claim: %d attempt(s), expected at least %d", cl.Attempts, least)
		}
	}
	r.save(s, m)
	return nil
}

func (r *run) await(s step) error {
	b, ok := r.bg[str(s, "name")]
	if !ok {
		return fmt.Errorf("no background step %q", str(s, "name"))
	}
	select {
	case <-b.done:
	case <-time.After(60 * time.Second):
		return fmt.Errorf("%s still running after 60 s", str(s, "name"))
	}
	if err := expectError(s, "await "+str(s, "name"), b.err); err != nil {
		return err
	}
	if rel, ok := s["released"].(bool); ok && b.err != nil {
		// The Go client wraps ErrOutcomeUnknown only when its release of
		// the id succeeded.
		if got := errors.Is(b.err, pgcoord.ErrOutcomeUnknown); got != rel {
			return fmt.Errorf("await %s: released is %v (%v)", str(s, "name"), got, b.err)
		}
	}
	return nil
}

func (r *run) release(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), retryBudget)
	defer cancel()
	rel, err := c.PermitRelease(ctx, str(s, "id"), nil)
	if err := expectError(s, "release", err); err != nil || s["error"] != nil {
		return err
	}
	if want, ok := s["expect"]; ok {
		m, err := asMap(rel)
		if err != nil {
			return err
		}
		return match(want, m, "release")
	}
	return nil
}

// giveUp releases an id given up after an unknown outcome; not_found
// (the id is retired) counts as success.
func (r *run) giveUp(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), retryBudget)
	defer cancel()
	_, err = c.PermitRelease(ctx, str(s, "id"), &pgcoord.ReleaseOptions{Reason: "given up"})
	if err != nil && !errors.Is(err, pgcoord.ErrNotFound) {
		return err
	}
	return nil
}

func (r *run) leaseAcquire(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	o := &pgcoord.LeaseOptions{TTL: time.Duration(num(s, "ttl_ms", 0)) * time.Millisecond}
	o.Wait, _ = s["wait"].(bool)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	res, err := c.LeaseAcquire(ctx, str(s, "name"), o)
	if err := expectError(s, "lease.acquire", err); err != nil || s["error"] != nil {
		return err
	}
	m, err := asMap(res)
	if err != nil {
		return err
	}
	if want, ok := s["expect"]; ok {
		if err := match(want, m, "lease.acquire"); err != nil {
			return err
		}
	}
	r.save(s, m)
	return nil
}

func (r *run) leaseRelease(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	released, err := c.LeaseRelease(ctx, str(s, "name"))
	if err != nil {
		return err
	}
	if want, ok := s["expect"]; ok {
		return match(want, map[string]interface{}{"released": released}, "lease.release")
	}
	return nil
}

// expectLeader polls the client's local belief (no I/O).
func (r *run) expectLeader(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	name, who := str(s, "name"), str(s, "client")
	want, _ := s["leader"].(bool)
	within := num(s, "within_ms", 0)
	end := time.Now().Add(time.Duration(within) * time.Millisecond)
	var leader bool
	var deadline time.Time
	for {
		leader, _, deadline = c.Leadership(name)
		if leader == want {
			break
		}
		if !time.Now().Before(end) {
			return fmt.Errorf("%s: leader of %s is not %v after %d ms", who, name, want, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	now := time.Now()
	if !want {
		if _, seen := r.beliefEnded[who+"\x00"+name]; !seen {
			r.beliefEnded[who+"\x00"+name] = now
		}
		return nil
	}
	if limit, ok := s["deadline_within_ms"].(int64); ok {
		left := deadline.Sub(now)
		if left <= 0 || left > time.Duration(limit)*time.Millisecond {
			return fmt.Errorf("%s: belief deadline %v ahead, expected within (0, %d ms]", who, left, limit)
		}
	}
	if other, ok := s["after_belief_of"].(string); ok {
		ended, seen := r.beliefEnded[other+"\x00"+name]
		if !seen || ended.After(now) {
			return fmt.Errorf("%s leads %s while %s may still believe it does", who, name, other)
		}
	}
	return nil
}

func (r *run) expectSession(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	want, _ := s["session"].(int64)
	if got := c.Session(); got != want {
		return fmt.Errorf("%s: session is %d, expected %d", str(s, "client"), got, want)
	}
	if res, ok := s["resumed"].(bool); ok && c.SessionResumed() != res {
		return fmt.Errorf("%s: resumed is %v", str(s, "client"), c.SessionResumed())
	}
	return nil
}

func (r *run) sql(s step) error {
	rows, err := psql(r.db.name, str(s, "query"))
	if err != nil {
		return err
	}
	want, ok := s["rows"].([]interface{})
	if !ok {
		return nil
	}
	// psql answers text: expected values (saved ints too) compare as text.
	var w [][]string
	for _, row := range want {
		cells, _ := row.([]interface{})
		line := []string{}
		for _, v := range cells {
			line = append(line, fmt.Sprint(v))
		}
		w = append(w, line)
	}
	if fmt.Sprint(rows) != fmt.Sprint(w) || len(rows) != len(w) {
		return fmt.Errorf("sql %q: rows %v, expected %v", str(s, "query"), rows, w)
	}
	return nil
}

var signals = map[string]syscall.Signal{"STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT,
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "HUP": syscall.SIGHUP, "INT": syscall.SIGINT}

func (r *run) signal(s step) error {
	a, ok := r.agents[str(s, "agent")]
	if !ok {
		return fmt.Errorf("no agent %q", str(s, "agent"))
	}
	sig, ok := signals[str(s, "signal")]
	if !ok {
		return fmt.Errorf("unknown signal %q", str(s, "signal"))
	}
	return a.signal(sig)
}
