package pgcoord

import (
	"context"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// belief is this client's view of whether its session leads one lease:
// a deadline on CLOCK_MONOTONIC, moved only by what the agent said (as
// libpgcoord's leases.c keeps it). changed is closed at every change.
type belief struct {
	leader  bool
	epoch   int64
	untilMs int64
	changed chan struct{}
}

// deadlineOf is the deadline a message grants: its stamp (a moment before
// it was sent) plus valid_ms, capped by the agent's own monotonic
// deadline when it sent one.
func deadlineOf(stampMs, validMs, untilMonoMs int64) int64 {
	until := stampMs + validMs
	if untilMonoMs > 0 && untilMonoMs < until {
		until = untilMonoMs
	}
	return until
}

func (c *Client) beliefLocked(name string) *belief {
	b := c.beliefs[name]
	if b == nil {
		b = &belief{changed: make(chan struct{})}
		c.beliefs[name] = b
	}
	return b
}

func (b *belief) set(leader bool, epoch, until int64) {
	b.leader, b.epoch, b.untilMs = leader, epoch, until
	if !leader {
		b.untilMs = 0
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// endBeliefsLocked ends every belief and wakes whoever waits on one (a
// campaign waiting in Elect re-checks that the session is still there).
func (c *Client) endBeliefsLocked() {
	for _, b := range c.beliefs {
		b.set(false, b.epoch, 0)
	}
}

// readBelief takes {name, leader, epoch, valid_ms}: leader only when the
// message is a well-formed "leader: true".
func readBelief(p map[string]interface{}) (name string, leader bool, epoch, validMs, mono int64) {
	name, _ = p["name"].(string)
	said, _ := p["leader"].(bool)
	var ok1, ok2 bool
	epoch, ok1 = asInt(p["epoch"])
	validMs, ok2 = asInt(p["valid_ms"])
	leader = said && ok1 && ok2 && validMs >= 0
	mono, _ = asInt(p["valid_until_mono_ms"])
	return
}

// noteBelief applies a notification to the beliefs, on the reader
// goroutine, the moment it is read (not when the application looks).
func (c *Client) noteBelief(method string, p map[string]interface{}, stamp int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch method {
	case "lease.changed":
		name, leader, epoch, valid, mono := readBelief(p)
		if name == "" {
			return
		}
		// Only this client's session can lead for us.
		if s, ok := asInt(p["session"]); leader && (c.session == 0 || (ok && s != c.session)) {
			return
		}
		if !leader {
			if b := c.beliefs[name]; b != nil && b.leader {
				b.set(false, epoch, 0)
			}
			return
		}
		c.beliefLocked(name).set(true, epoch, deadlineOf(stamp, valid, mono))
	case "lease.renewed":
		name, leader, epoch, valid, mono := readBelief(p)
		// A renewal extends only the belief a lease.changed (or an
		// acquire) started, under the same epoch.
		if b := c.beliefs[name]; leader && b != nil && b.leader && b.epoch == epoch {
			b.set(true, epoch, deadlineOf(stamp, valid, mono))
		}
	case "session.lost":
		if s, ok := asInt(p["session"]); ok && s == c.session {
			c.endBeliefsLocked()
		}
	case "session.suspended":
		// The session may be gone in safe_ms: no belief outlives that
		// unless a renewal comes first.
		s, ok1 := asInt(p["session"])
		safe, ok2 := asInt(p["safe_ms"])
		if !ok1 || !ok2 || s != c.session {
			return
		}
		if safe < 0 {
			safe = 0
		}
		for _, b := range c.beliefs {
			if b.leader && b.untilMs > stamp+safe {
				b.set(true, b.epoch, stamp+safe)
			}
		}
	}
}

// Holder names a lease's holder.
type Holder struct {
	Session   int64  `msgpack:"session"`
	ReplicaID string `msgpack:"replica_id"`
}

// LeaseResult is lease.acquire's result.
type LeaseResult struct {
	Name             string  `msgpack:"name"`
	Leader           bool    `msgpack:"leader"`
	Epoch            int64   `msgpack:"epoch"`
	ValidMs          int64   `msgpack:"valid_ms"`
	ValidUntilMonoMs int64   `msgpack:"valid_until_mono_ms"`
	Campaigning      bool    `msgpack:"campaigning"`
	TTLMs            int64   `msgpack:"ttl_ms"`
	Holder           *Holder `msgpack:"holder"`
	ExpiresInMs      int64   `msgpack:"expires_in_ms"`
}

// LeaseOptions are lease.acquire's optional params (0: the agent's default).
type LeaseOptions struct {
	TTL   time.Duration
	Renew time.Duration
	Wait  bool // keep campaigning until won; a win comes as lease.changed
}

// LeaseAcquire tries (or, with Wait, campaigns) for a lease. The belief it
// starts is kept from the reply in stream order with the notifications.
func (c *Client) LeaseAcquire(ctx context.Context, name string, o *LeaseOptions) (*LeaseResult, error) {
	if name == "" {
		return nil, &Error{Code: "invalid_params", Message: "the lease name is empty", Method: "lease.acquire"}
	}
	p := map[string]interface{}{"name": name}
	if o != nil {
		if o.TTL > 0 {
			p["ttl_ms"] = o.TTL.Milliseconds()
		}
		if o.Renew > 0 {
			p["renew_ms"] = o.Renew.Milliseconds()
		}
		p["wait"] = o.Wait
	}
	var res LeaseResult
	err := c.callHook(ctx, "lease.acquire", p, &res, func(raw msgpack.RawMessage, stamp int64) {
		var r LeaseResult
		if msgpack.Unmarshal(raw, &r) != nil {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		b := c.beliefLocked(name)
		if r.Leader && r.ValidMs >= 0 {
			b.set(true, r.Epoch, deadlineOf(stamp, r.ValidMs, r.ValidUntilMonoMs))
		} else if b.leader {
			b.set(false, r.Epoch, 0)
		}
	})
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// LeaseRelease hands a lease back; belief ends before the request is sent.
func (c *Client) LeaseRelease(ctx context.Context, name string) (released bool, err error) {
	c.mu.Lock()
	if b := c.beliefs[name]; b != nil && b.leader {
		b.set(false, b.epoch, 0)
	}
	c.mu.Unlock()
	var r struct {
		Released bool `msgpack:"released"`
	}
	err = c.call(ctx, "lease.release", map[string]interface{}{"name": name}, &r)
	return r.Released, err
}

// IsLeader says whether this client's session leads name now. It never
// does I/O: it compares the belief deadline with the monotonic clock.
func (c *Client) IsLeader(name string) bool {
	ok, _, _ := c.Leadership(name)
	return ok
}

// Leadership is the belief for name: whether it leads now, under which
// epoch (the fencing token) and until when (a time.Time whose monotonic
// reading is exact). No I/O.
func (c *Client) Leadership(name string) (leader bool, epoch int64, deadline time.Time) {
	now := monoMillis()
	wall := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.beliefs[name]
	if b == nil || !b.leader || now >= b.untilMs {
		return false, 0, time.Time{}
	}
	return true, b.epoch, wall.Add(time.Duration(b.untilMs-now) * time.Millisecond)
}

// Elect campaigns for name until this session leads it or ctx ends, and
// returns a context that is cancelled when the belief ends: at its
// deadline (which comes renew_ms before the lease can expire for anyone
// else), when the agent says the lease or session was lost, or when the
// connection breaks. A session must be open. The returned cancel
// releases the lease.
func (c *Client) Elect(ctx context.Context, name string, o *LeaseOptions) (context.Context, context.CancelFunc, error) {
	opts := LeaseOptions{Wait: true}
	if o != nil {
		opts.TTL, opts.Renew = o.TTL, o.Renew
	}
	c.mu.Lock()
	b := c.beliefLocked(name)
	c.mu.Unlock()
	if _, err := c.LeaseAcquire(ctx, name, &opts); err != nil {
		return nil, nil, err
	}
	for {
		c.mu.Lock()
		lead, ch, session := b.leader && monoMillis() < b.untilMs, b.changed, c.session
		c.mu.Unlock()
		if lead {
			break
		}
		if session == 0 {
			return nil, nil, fmt.Errorf("%w: the session ended while campaigning for %q", ErrNotLeader, name)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			// Stop campaigning: a win nobody waits for is a leader
			// that does nothing.
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = c.LeaseRelease(rctx, name)
			cancel()
			return nil, nil, ctx.Err()
		}
	}
	lctx, cancel := context.WithCancel(ctx)
	go c.holdLeadership(lctx, cancel, b)
	release := func() {
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = c.LeaseRelease(rctx, name)
		rcancel()
	}
	return lctx, release, nil
}

// holdLeadership cancels a leadership context when its belief ends.
func (c *Client) holdLeadership(ctx context.Context, cancel context.CancelFunc, b *belief) {
	defer cancel()
	c.mu.Lock()
	epoch := b.epoch
	c.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		leader, until, ch, ep := b.leader, b.untilMs, b.changed, b.epoch
		c.mu.Unlock()
		left := until - monoMillis()
		if !leader || left <= 0 || ep != epoch {
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Duration(left) * time.Millisecond)
		select {
		case <-timer.C:
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}
