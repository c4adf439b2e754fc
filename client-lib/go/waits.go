package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Outcomes of ClaimWait other than an admission.
var (
	// ErrWaitExpired: the claim left the queue without admission
	// (permit.expired: its wait_ms elapsed, or an admin cancelled it).
	// Nothing of it remains; the id is free again.
	ErrWaitExpired = errors.New("pgcoord: the waiting claim expired")
	// ErrDenied: the claim was denied outright (it could not even queue).
	ErrDenied = errors.New("pgcoord: the claim was denied")
)

// Cancel is permit.cancel's result: Status "cancelled" (Cancelled: it left
// the queue), or "admitted"/"held" (the caller owns a permit it must
// release) or "released".
type Cancel struct {
	ID        string `msgpack:"id"`
	Cancelled bool   `msgpack:"cancelled"`
	Status    string `msgpack:"status"`
	NowAt     int64  `msgpack:"now_at"`
}

// PermitCancel takes the session's waiting claim id out of the queue
// (ErrNotFound when it is neither queued nor a permit).
func (c *Client) PermitCancel(ctx context.Context, id string) (*Cancel, error) {
	var r Cancel
	return &r, c.call(ctx, "permit.cancel", map[string]interface{}{"id": id}, &r)
}

// waiter is one ClaimWait's ear for its id's outcome: the notification,
// or lost (closed when the connection or the session that queued it went).
type waiter struct {
	outcome chan Notification
	lost    chan struct{}
	why     string
	armed   bool // queued: a failure before that was retried by PermitClaim
}

func (c *Client) addWaiter(id string) (*waiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiters == nil {
		c.waiters = map[string]*waiter{}
	}
	if c.waiters[id] != nil {
		return nil, fmt.Errorf("pgcoord: ClaimWait of %q is already running on this client", id)
	}
	w := &waiter{outcome: make(chan Notification, 1), lost: make(chan struct{})}
	c.waiters[id] = w
	return w, nil
}

func (c *Client) dropWaiter(id string, w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiters[id] == w {
		delete(c.waiters, id)
	}
}

// noteWaiter hands permit.admitted/permit.expired to the ClaimWait of
// that id, on the reader goroutine (the reply that queued it came first).
func (c *Client) noteWaiter(method string, p map[string]interface{}) {
	if method != "permit.admitted" && method != "permit.expired" {
		return
	}
	id, _ := p["id"].(string)
	c.mu.Lock()
	w := c.waiters[id]
	c.mu.Unlock()
	if w != nil {
		select {
		case w.outcome <- Notification{Method: method, Params: p}:
		default:
		}
	}
}

// failWaitersLocked ends every ClaimWait: what was pushed to the lost
// connection or session is not pushed again.
func (c *Client) failWaitersLocked(why string) {
	for id, w := range c.waiters {
		if !w.armed {
			continue
		}
		w.why = why
		close(w.lost)
		delete(c.waiters, id)
	}
}

// ClaimWait claims id with o.WaitMs (> 0) and waits for the outcome: the
// admission (at once or from the queue), or ErrWaitExpired, ErrDenied.
// When ctx ends while it waits, the claim is cancelled (a permit it was
// admitted to meanwhile is released, so nothing leaks) and the error
// wraps ctx.Err(). When the connection or the session breaks while it
// waits, the error wraps ErrConnection (Retryable): a retry with the same
// id answers the current state (still queued: it waits on; admitted:
// "held").
func (c *Client) ClaimWait(ctx context.Context, id string, quotas []QuotaWeight, o *ClaimOptions) (*Claim, error) {
	if o == nil || o.WaitMs <= 0 {
		return nil, fmt.Errorf("%w: ClaimWait needs WaitMs > 0", ErrInvalidParams)
	}
	w, err := c.addWaiter(id)
	if err != nil {
		return nil, err
	}
	defer c.dropWaiter(id, w)
	r, err := c.PermitClaim(ctx, id, quotas, o)
	if err != nil {
		return r, err
	}
	switch r.Status {
	case "queued":
		if !r.Mine { // its outcome is pushed to the session that queued it
			return r, fmt.Errorf("%w: %q is queued by another session", ErrConflict, id)
		}
		c.mu.Lock()
		w.armed = true
		if c.cn == nil || c.cn.isDead() {
			c.failWaitersLocked("the connection broke")
		}
		c.mu.Unlock()
	case "denied":
		return r, fmt.Errorf("%w: quota %q", ErrDenied, r.Quota)
	default:
		return r, nil
	}
	// The outcome is pushed; the timer only covers one that was pushed
	// and lost (a connection that broke between the reply and arming).
	left := time.Duration(r.DeadlineAt-r.NowAt)*time.Millisecond + 5*time.Second
	timer := time.NewTimer(left)
	defer timer.Stop()
	select {
	case n := <-w.outcome:
		return outcomeOf(n)
	case <-w.lost:
		return nil, fmt.Errorf("%w: waiting for %q: %s", ErrConnection, id, w.why)
	case <-timer.C:
		return c.settleWait(id, w, nil)
	case <-ctx.Done():
		return c.settleWait(id, w, ctx.Err())
	}
}

func outcomeOf(n Notification) (*Claim, error) {
	p := n.Params
	if n.Method == "permit.expired" {
		reason, _ := p["reason"].(string)
		return nil, fmt.Errorf("%w: %s", ErrWaitExpired, reason)
	}
	r := &Claim{Status: "admitted", Mine: true, Attempts: 1}
	r.ID, _ = p["id"].(string)
	r.Token, _ = asInt(p["token"])
	r.State, _ = p["state"].(string)
	r.Phase, _ = p["phase"].(string)
	r.OwnerSession, _ = asInt(p["owner_session"])
	r.OwnerReplica, _ = p["owner_replica"].(string)
	r.CreatedAt, _ = asInt(p["created_at"])
	r.QueuedMs, _ = asInt(p["queued_ms"])
	r.NowAt, _ = asInt(p["now_at"])
	return r, nil
}

// settleWait ends a wait the caller gave up (cause: its ctx error) or
// whose outcome was not heard (cause nil) by cancelling it. A claim that
// was admitted meanwhile is released when the caller gave up, and
// answered (as "held", with its token) when it was not heard.
func (c *Client) settleWait(id string, w *waiter, cause error) (*Claim, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.PermitCancel(ctx, id)
	if errors.Is(err, ErrNotFound) {
		// Neither queued nor a permit: the outcome came while we asked.
		n := Notification{Method: "permit.expired", Params: map[string]interface{}{"reason": "no longer queued"}}
		select {
		case n = <-w.outcome:
		default:
		}
		if cause == nil || n.Method == "permit.expired" {
			if cause != nil {
				return nil, cause
			}
			return outcomeOf(n)
		}
		r, err = &Cancel{ID: id, Status: "admitted"}, nil
	}
	if err != nil {
		if cause != nil {
			return nil, fmt.Errorf("%w (cancelling %q failed: %v)", cause, id, err)
		}
		return nil, err
	}
	if r.Status != "admitted" && r.Status != "held" {
		if cause != nil {
			return nil, cause
		}
		return nil, fmt.Errorf("%w: cancelled after no outcome was heard", ErrWaitExpired)
	}
	if cause != nil {
		_, rerr := c.PermitRelease(ctx, id, &ReleaseOptions{Reason: "waiting claim given up"})
		if rerr != nil && !errors.Is(rerr, ErrNotFound) {
			return nil, fmt.Errorf("%w (releasing %q, admitted meanwhile, failed: %v)", cause, id, rerr)
		}
		return nil, cause
	}
	// Admitted but not heard: the permit is the caller's.
	p, err := c.PermitGet(ctx, id)
	if err != nil {
		return nil, err
	}
	held := &Claim{Status: "held", ID: id, Token: p.Token, State: p.State, Phase: p.Phase,
		Mine: true, CreatedAt: p.CreatedAt, NowAt: r.NowAt, Attempts: 1}
	if p.OwnerSession != nil {
		held.OwnerSession = *p.OwnerSession
	}
	if p.OwnerReplica != nil {
		held.OwnerReplica = *p.OwnerReplica
	}
	return held, nil
}
