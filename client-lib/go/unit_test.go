package pgcoord

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

func TestDeadlineTakesTheEarlier(t *testing.T) {
	if got := deadlineOf(1000, 500, 0); got != 1500 {
		t.Fatalf("no mono deadline: got %d, want 1500", got)
	}
	if got := deadlineOf(1000, 500, 1200); got != 1200 {
		t.Fatalf("agent's mono deadline first: got %d, want 1200", got)
	}
	if got := deadlineOf(1000, 500, 9000); got != 1500 {
		t.Fatalf("a later mono deadline must not extend: got %d", got)
	}
}

func TestRenewalOnlyExtendsTheSameEpoch(t *testing.T) {
	c := &Client{beliefs: map[string]*belief{}, session: 7}
	now := monoMillis()
	c.noteBelief("lease.changed", map[string]interface{}{"name": "x", "leader": true,
		"epoch": int64(3), "valid_ms": int64(5000), "session": int64(7)}, now)
	if !c.IsLeader("x") {
		t.Fatal("lease.changed leader: true did not start the belief")
	}
	c.noteBelief("lease.renewed", map[string]interface{}{"name": "x", "leader": true,
		"epoch": int64(4), "valid_ms": int64(60000)}, now)
	if _, _, dl := c.Leadership("x"); time.Until(dl) > 6*time.Second {
		t.Fatal("a renewal of another epoch extended the belief")
	}
	c.noteBelief("lease.changed", map[string]interface{}{"name": "x", "leader": true,
		"epoch": int64(5), "valid_ms": int64(5000), "session": int64(8)}, now)
	if _, ep, _ := c.Leadership("x"); ep != 3 {
		t.Fatal("another session's win became our belief")
	}
	c.noteBelief("session.suspended", map[string]interface{}{"session": int64(7),
		"safe_ms": int64(100)}, now)
	if _, _, dl := c.Leadership("x"); time.Until(dl) > 200*time.Millisecond {
		t.Fatal("session.suspended did not cap the belief at safe_ms")
	}
	c.noteBelief("session.lost", map[string]interface{}{"session": int64(7)}, now)
	if c.IsLeader("x") {
		t.Fatal("session.lost did not end the belief")
	}
}

func TestStaleStampEndsBelief(t *testing.T) {
	c := &Client{beliefs: map[string]*belief{}, session: 1}
	// Read now, but the queue was last seen empty 2 s ago: 1.5 s of
	// valid_ms are already spent.
	c.noteBelief("lease.changed", map[string]interface{}{"name": "x", "leader": true,
		"epoch": int64(1), "valid_ms": int64(1500)}, monoMillis()-2000)
	if c.IsLeader("x") {
		t.Fatal("belief dated from the read, not from before the send")
	}
}

func TestErrorMapping(t *testing.T) {
	frame := []byte{0x94, 0x01, 0x05, 0x83}
	frame = append(frame, mustPack(t, "code")...)
	frame = append(frame, mustPack(t, "timeout")...)
	frame = append(frame, mustPack(t, "message")...)
	frame = append(frame, mustPack(t, "no answer")...)
	frame = append(frame, mustPack(t, "retryable")...)
	frame = append(frame, 0xc3, 0xc0)
	m, err := decodeMessage(frame)
	if err != nil {
		t.Fatal(err)
	}
	var e error = m.err
	if !errors.Is(e, ErrTimeout) || errors.Is(e, ErrBusy) || !Retryable(e) || m.msgid != 5 {
		t.Fatalf("error mapping: %#v", m.err)
	}
	if !outcomeUnknown(e) || outcomeUnknown(ErrConflict) {
		t.Fatal("outcome-unknown rule")
	}
}

func TestRequestBytesAreCompact(t *testing.T) {
	b, err := encodeRequest(1, "agent.ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{0x94, 0x00, 0x01, 0xaa}, "agent.ping"...)
	want = append(want, 0x91, 0x80)
	if !bytes.Equal(b, want) {
		t.Fatalf("got % x, want % x", b, want)
	}
}

func mustPack(t *testing.T, v interface{}) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakePeer listens on a socket and answers each connection with serve.
func fakePeer(t *testing.T, serve func(net.Conn)) string {
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return path
}

func TestFramingSplitAcrossReads(t *testing.T) {
	path := fakePeer(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 256)
		if _, err := c.Read(buf); err != nil {
			return
		}
		// A notification and the reply, cut in the middle of both.
		note := mustPack(t, []interface{}{2, "agent.db_up", []interface{}{map[string]interface{}{}}})
		rep := mustPack(t, []interface{}{1, 1, nil, map[string]interface{}{"pong": true}})
		all := append(note, rep...)
		for i := range all {
			c.Write(all[i : i+1])
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Second)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-c.Notifications():
		if n.Method != "agent.db_up" {
			t.Fatalf("notification %q", n.Method)
		}
	case <-ctx.Done():
		t.Fatal("no notification")
	}
}

func TestGarbageIsAnErrorNotAHang(t *testing.T) {
	for name, answer := range map[string][]byte{
		"never-used byte":     {0xc1},
		"not an envelope":     mustPack(t, map[string]interface{}{"a": 1}),
		"closed":              nil,
		"wrong kind":          mustPack(t, []interface{}{7, 1, nil, nil}),
		"error without code":  mustPack(t, []interface{}{1, 1, map[string]interface{}{"x": 1}, nil}),
		"result of bad shape": mustPack(t, []interface{}{1, 1, nil, "pong"}),
	} {
		answer := answer
		t.Run(name, func(t *testing.T) {
			path := fakePeer(t, func(c net.Conn) {
				defer c.Close()
				buf := make([]byte, 256)
				c.Read(buf)
				c.Write(answer)
				time.Sleep(time.Second)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := Dial(ctx, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Status(ctx)
			if err == nil || ctx.Err() != nil {
				t.Fatalf("got %v (ctx %v), want a prompt error", err, ctx.Err())
			}
		})
	}
}

// A lease message that comes after a quiet spell is dated by the last
// slice that saw the queue empty, not by when the quiet began.
func TestLeaseMessageAfterQuietSpell(t *testing.T) {
	path := fakePeer(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 256)
		if _, err := c.Read(buf); err != nil { // lease.acquire
			return
		}
		c.Write(mustPack(t, []interface{}{1, 1, nil, map[string]interface{}{
			"name": "x", "leader": false, "epoch": 0, "valid_ms": 0,
			"valid_until_mono_ms": 0, "campaigning": true}}))
		time.Sleep(1500 * time.Millisecond)
		c.Write(mustPack(t, []interface{}{2, "lease.changed", []interface{}{map[string]interface{}{
			"name": "x", "epoch": 9, "leader": true, "valid_ms": 1000,
			"valid_until_mono_ms": 0, "session": 4, "reason": "won"}}}))
		time.Sleep(2 * time.Second)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.session = 4
	if _, err := c.LeaseAcquire(ctx, "x", &LeaseOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	for !c.IsLeader("x") {
		if ctx.Err() != nil {
			t.Fatal("the win after 1.5 s of quiet was dated as old as the quiet")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ep, dl := c.Leadership("x"); ep != 9 || time.Until(dl) > time.Second {
		t.Fatalf("epoch %d, deadline in %v", ep, time.Until(dl))
	}
}

func TestNoAgentAndClosedClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none"), nil); !errors.Is(err, ErrConnection) {
		t.Fatalf("dial of a missing socket: %v", err)
	}
	path := fakePeer(t, func(c net.Conn) { time.Sleep(time.Second); c.Close() })
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := c.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("call on a closed client: %v", err)
	}
	if _, ok := <-c.Notifications(); ok {
		t.Fatal("notifications still open after Close")
	}
	c2, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Call(ctx, "agent.ping", map[string]interface{}{"x": make(chan int)}, nil); err == nil {
		t.Fatal("a param msgpack cannot encode went through")
	}
}

// An agent that starts a reply and hangs up mid-frame: a connection error
// at the hang-up, not a wait for the rest.
func TestTruncatedFrameThenCloseIsAConnectionError(t *testing.T) {
	whole := mustPack(t, []interface{}{1, 1, nil, map[string]interface{}{"pong": true}})
	path := fakePeer(t, func(c net.Conn) {
		buf := make([]byte, 256)
		c.Read(buf)
		c.Write(whole[:len(whole)-3])
		c.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started := time.Now()
	err = c.Ping(ctx)
	if !errors.Is(err, ErrConnection) || !Retryable(err) {
		t.Fatalf("got %v, want a retryable ErrConnection", err)
	}
	if time.Since(started) > 2*time.Second {
		t.Fatalf("took %v", time.Since(started))
	}
}

// An agent that never answers: the call ends at its context's deadline
// with the context's error, and the client stays usable.
func TestSilentAgentEndsAtTheDeadline(t *testing.T) {
	path := fakePeer(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 256)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	started := time.Now()
	err = c.Ping(short)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errAbandoned) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(started); d < 250*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("returned after %v, want about 300ms", d)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	if err := c.Ping(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call with a cancelled context: %v", err)
	}
}

// Params of the wrong type are refused before anything is sent, with an
// error, not a panic.
func TestWrongTypesAreErrors(t *testing.T) {
	got := make(chan []byte, 4)
	path := fakePeer(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			got <- append([]byte(nil), buf[:n]...)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.LeaseAcquire(ctx, "", nil); !errors.Is(err, ErrInvalidParams) {
		t.Fatalf("an empty lease name: %v", err)
	}
	var out struct{ Pong string }
	if err := c.Call(ctx, "agent.ping", map[string]interface{}{"f": func() {}}, &out); err == nil {
		t.Fatal("a func param went through")
	}
	select {
	case b := <-got:
		t.Fatalf("the agent got %x", b)
	case <-time.After(100 * time.Millisecond):
	}
}

// waitPeer answers permit.claim with "queued", then what then says: each
// request's method is reported on seen, and then(method) gives the
// frames (reply and notifications) to write for it.
func waitPeer(t *testing.T, seen chan<- string, then func(msgid interface{}, method string) []interface{}) string {
	return fakePeer(t, func(c net.Conn) {
		defer c.Close()
		dec := msgpack.NewDecoder(c)
		for {
			var req []interface{}
			if err := dec.Decode(&req); err != nil || len(req) != 4 {
				return
			}
			method, _ := req[2].(string)
			seen <- method
			for _, f := range then(req[1], method) {
				c.Write(mustPack(t, f))
			}
		}
	})
}

func queuedReply(msgid interface{}) []interface{} {
	return []interface{}{1, msgid, nil, map[string]interface{}{"status": "queued", "id": "w",
		"position": 2, "queued_at": 1000, "deadline_at": 61000, "mine": true, "now_at": 1000}}
}

func TestClaimWaitQueuedThenAdmittedOrExpired(t *testing.T) {
	for outcome, want := range map[string]error{"permit.admitted": nil, "permit.expired": ErrWaitExpired} {
		outcome, want := outcome, want
		t.Run(outcome, func(t *testing.T) {
			seen := make(chan string, 8)
			path := waitPeer(t, seen, func(msgid interface{}, method string) []interface{} {
				return []interface{}{queuedReply(msgid), []interface{}{2, outcome, []interface{}{
					map[string]interface{}{"id": "w", "token": 7, "state": "held", "phase": "claimed",
						"owner_session": 3, "queued_ms": 40, "reason": "wait_ms elapsed", "now_at": 1040}}}}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := Dial(ctx, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r, err := c.ClaimWait(ctx, "w", []QuotaWeight{{Key: "q"}}, &ClaimOptions{WaitMs: 60000})
			if want != nil {
				if !errors.Is(err, want) || r != nil {
					t.Fatalf("got %v, %v; want %v", r, err, want)
				}
				return
			}
			if err != nil || !r.Admitted() || r.Token != 7 || r.QueuedMs != 40 || r.OwnerSession != 3 {
				t.Fatalf("got %+v, %v", r, err)
			}
			if n := <-c.Notifications(); n.Method != "permit.admitted" {
				t.Fatalf("the notification did not reach the channel too: %q", n.Method)
			}
		})
	}
}

// A caller that gives up a wait that was admitted meanwhile releases it.
func TestClaimWaitCancelReleasesALateAdmission(t *testing.T) {
	seen := make(chan string, 8)
	path := waitPeer(t, seen, func(msgid interface{}, method string) []interface{} {
		switch method {
		case "permit.claim":
			return []interface{}{queuedReply(msgid)}
		case "permit.cancel":
			return []interface{}{[]interface{}{1, msgid, nil, map[string]interface{}{
				"id": "w", "cancelled": false, "status": "held", "now_at": 2000}}}
		}
		return []interface{}{[]interface{}{1, msgid, nil, map[string]interface{}{
			"id": "w", "released": true, "state": "released", "now_at": 2001}}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	if _, err := c.ClaimWait(wctx, "w", []QuotaWeight{{Key: "q"}}, &ClaimOptions{WaitMs: 60000}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a given-up wait: %v", err)
	}
	for _, want := range []string{"permit.claim", "permit.cancel", "permit.release"} {
		if got := <-seen; got != want {
			t.Fatalf("sent %q, want %q", got, want)
		}
	}
}

// A connection that breaks while waiting fails the wait retryably.
func TestClaimWaitLostConnectionIsRetryable(t *testing.T) {
	path := fakePeer(t, func(c net.Conn) {
		defer c.Close()
		var req []interface{}
		if msgpack.NewDecoder(c).Decode(&req) == nil && len(req) == 4 {
			c.Write(mustPack(t, queuedReply(req[1])))
			time.Sleep(100 * time.Millisecond)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.ClaimWait(ctx, "w", []QuotaWeight{{Key: "q"}}, &ClaimOptions{WaitMs: 60000})
	if !errors.Is(err, ErrConnection) || !Retryable(err) || ctx.Err() != nil {
		t.Fatalf("a wait on a broken connection: %v", err)
	}
}
