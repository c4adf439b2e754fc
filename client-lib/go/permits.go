package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// QuotaWeight is one quota a permit takes, with its weight (0: 1).
type QuotaWeight struct {
	Key    string `msgpack:"key"`
	Weight int64  `msgpack:"weight,omitempty"`
}

// ClaimOptions are permit.claim's optional params.
type ClaimOptions struct {
	Intent        []byte // committed with the permit, before any dispatch
	OnOwnerLoss   string // "uncertain" (default) or "release"
	Limit         *int64 // only with one quota: creates (admin: sets) it
	ReleaseReason string // the reason given when a claim is given up
	// WaitMs (0..3600000): when the claim cannot be admitted now, it
	// joins the fleet-wide FIFO queue for that long and answers "queued";
	// its outcome comes as permit.admitted or permit.expired (ClaimWait
	// waits for it).
	WaitMs int64
}

// Claim is permit.claim's result: Status "admitted", "held", "denied"
// (the denied fields are Quota, Limit, InFlight, Weight, Waiting) or
// "queued" (Position, QueuedAt, DeadlineAt; Mine is false when another
// session queued the id).
type Claim struct {
	Status       string `msgpack:"status"`
	ID           string `msgpack:"id"`
	Token        int64  `msgpack:"token"`
	State        string `msgpack:"state"`
	Phase        string `msgpack:"phase"`
	OwnerSession int64  `msgpack:"owner_session"`
	OwnerReplica string `msgpack:"owner_replica"`
	Mine         bool   `msgpack:"mine"`
	CreatedAt    int64  `msgpack:"created_at"`
	Quota        string `msgpack:"quota"`
	Limit        int64  `msgpack:"limit"`
	InFlight     int64  `msgpack:"in_flight"`
	Weight       int64  `msgpack:"weight"`
	Waiting      int64  `msgpack:"waiting"`     // denied: waiters queued on Quota
	Position     int64  `msgpack:"position"`    // queued: 1 is next in line
	QueuedAt     int64  `msgpack:"queued_at"`   // queued: ms, database clock
	DeadlineAt   int64  `msgpack:"deadline_at"` // queued: ms, database clock
	QueuedMs     int64  `msgpack:"queued_ms"`   // admitted from the queue: how long it waited
	NowAt        int64  `msgpack:"now_at"`
	// Denied or queued: who holds the room (PROTOCOL.md, "Who holds the
	// room"); a queued answer has Quota, Limit and InFlight too. Hidden:
	// open permits on Quota the caller may not see (another uid's).
	Hidden   int64         `msgpack:"hidden"`
	Holders  []QuotaHolder `msgpack:"holders"` // largest first, at most 5
	Retired  bool          `msgpack:"-"`       // denied after an unseen attempt: the id was released
	Attempts int           `msgpack:"-"`
}

// QuotaHolder is one open permit holding a quota's room, in a denied or
// queued Claim.
type QuotaHolder struct {
	ID           string `msgpack:"id"`
	Weight       int64  `msgpack:"weight"`
	State        string `msgpack:"state"` // "held" or "uncertain"
	OwnerReplica string `msgpack:"owner_replica"`
	OwnerSession int64  `msgpack:"owner_session"`
	AgeMs        int64  `msgpack:"age_ms"` // since its claim
	Reason       string `msgpack:"reason"` // an uncertain one's
}

// Admitted says the caller holds the permit (this attempt or an earlier
// one of the same id took the slots).
func (c *Claim) Admitted() bool { return c.Status == "admitted" || c.Status == "held" }

// Queued says the claim waits in the queue (see ClaimWait).
func (c *Claim) Queued() bool { return c.Status == "queued" }

// PermitClaim claims id, retrying with the same id while the answer is
// retryable (the outcome of an unseen attempt is found by the retry).
// When ctx ends while an attempt's outcome is unknown, the id is released
// so a late commit cannot keep a slot, and the error wraps
// ErrOutcomeUnknown. A "denied" after an unseen attempt releases the id
// too (denied speaks only for the retry); the Claim says Retired.
func (c *Client) PermitClaim(ctx context.Context, id string, quotas []QuotaWeight, o *ClaimOptions) (*Claim, error) {
	p := map[string]interface{}{"id": id}
	qs := make([]interface{}, 0, len(quotas))
	for _, q := range quotas {
		m := map[string]interface{}{"key": q.Key}
		if q.Weight != 0 {
			m["weight"] = q.Weight
		}
		qs = append(qs, m)
	}
	p["quotas"] = qs
	reason := "claim given up after an unknown outcome"
	waiting := false
	if o != nil {
		if o.WaitMs != 0 {
			p["wait_ms"] = o.WaitMs
			waiting = true
		}
		if o.Intent != nil {
			p["intent"] = o.Intent
		}
		if o.OnOwnerLoss != "" {
			p["on_owner_loss"] = o.OnOwnerLoss
		}
		if o.Limit != nil {
			p["limit"] = *o.Limit
		}
		if o.ReleaseReason != "" {
			reason = o.ReleaseReason
		}
	}
	unseen := false
	for attempt := 1; ; attempt++ {
		var r Claim
		err := c.call(ctx, "permit.claim", p, &r)
		if err == nil {
			r.Attempts = attempt
			if r.Status == "denied" && unseen {
				if rerr := c.giveUp(id, reason, waiting); rerr != nil {
					return &r, fmt.Errorf("denied after an unseen attempt, and releasing %q failed: %w", id, rerr)
				}
				r.Retired = true
			}
			return &r, nil
		}
		if outcomeUnknown(err) {
			unseen = true
		}
		if !Retryable(err) && !errors.Is(err, errAbandoned) {
			if unseen {
				return nil, c.giveUpErr(id, reason, waiting, err)
			}
			return nil, err
		}
		if !sleepCtx(ctx, c.opts.RetryBackoff) || errors.Is(err, errAbandoned) {
			if unseen {
				return nil, c.giveUpErr(id, reason, waiting, err)
			}
			return nil, err
		}
	}
}

func (c *Client) giveUpErr(id, reason string, waiting bool, cause error) error {
	if rerr := c.giveUp(id, reason, waiting); rerr != nil {
		return fmt.Errorf("pgcoord: claim of %q gave up (%v) and its release failed: %w", id, cause, rerr)
	}
	return fmt.Errorf("%w: claim of %q: %v", ErrOutcomeUnknown, id, cause)
}

// giveUp releases an id whose claim was abandoned, with its own deadline
// (the caller's context has ended): the release settles every attempt.
// A claim that may have queued is cancelled first: a release does not
// take an id out of the queue.
func (c *Client) giveUp(id, reason string, waiting bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if waiting {
		r, err := c.PermitCancel(ctx, id)
		if errors.Is(err, ErrNotFound) || (err == nil && r.Status != "held" && r.Status != "admitted") {
			return nil // out of the queue, or never in it, and no permit
		}
		if err != nil {
			return err
		}
	}
	_, err := c.PermitRelease(ctx, id, &ReleaseOptions{Reason: reason})
	if errors.Is(err, ErrNotFound) { // no permit: the id is now retired
		return nil
	}
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ReleaseOptions are permit.release's optional params.
type ReleaseOptions struct {
	Override bool
	Reason   string
}

// Release is permit.release's result.
type Release struct {
	ID         string `msgpack:"id"`
	Released   bool   `msgpack:"released"`
	State      string `msgpack:"state"`
	ReleasedAt *int64 `msgpack:"released_at"`
	NowAt      int64  `msgpack:"now_at"`
}

// PermitRelease releases id, retrying with the same id while retryable
// (it is idempotent). ErrNotFound for an id with no permit: a release by
// a session then retires the id.
func (c *Client) PermitRelease(ctx context.Context, id string, o *ReleaseOptions) (*Release, error) {
	p := map[string]interface{}{"id": id}
	if o != nil {
		if o.Override {
			p["override"] = true
		}
		if o.Reason != "" {
			p["reason"] = o.Reason
		}
	}
	for {
		var r Release
		err := c.call(ctx, "permit.release", p, &r)
		if err == nil {
			return &r, nil
		}
		if !Retryable(err) || !sleepCtx(ctx, c.opts.RetryBackoff) {
			return nil, err
		}
	}
}

// PhaseResult is permit.update's result.
type PhaseResult struct {
	ID      string `msgpack:"id"`
	Phase   string `msgpack:"phase"`
	State   string `msgpack:"state"`
	Changed bool   `msgpack:"changed"`
	PhaseAt int64  `msgpack:"phase_at"`
	NowAt   int64  `msgpack:"now_at"`
}

// PermitUpdate moves a permit's phase forward.
func (c *Client) PermitUpdate(ctx context.Context, id, phase string) (*PhaseResult, error) {
	var r PhaseResult
	return &r, c.call(ctx, "permit.update", map[string]interface{}{"id": id, "phase": phase}, &r)
}

// StateResult is permit.mark_uncertain's result.
type StateResult struct {
	ID      string `msgpack:"id"`
	State   string `msgpack:"state"`
	Changed bool   `msgpack:"changed"`
	StateAt int64  `msgpack:"state_at"`
	NowAt   int64  `msgpack:"now_at"`
}

// PermitMarkUncertain says the owner lost sight of the work.
func (c *Client) PermitMarkUncertain(ctx context.Context, id, reason string) (*StateResult, error) {
	var r StateResult
	return &r, c.call(ctx, "permit.mark_uncertain", map[string]interface{}{"id": id, "reason": reason}, &r)
}

// Resolution is permit.resolve's result.
type Resolution struct {
	ID           string  `msgpack:"id"`
	State        string  `msgpack:"state"`
	OwnerSession *int64  `msgpack:"owner_session"`
	Changed      bool    `msgpack:"changed"`
	Detail       *string `msgpack:"detail"`
	NowAt        int64   `msgpack:"now_at"`
}

// PermitResolve settles a permit on evidence: outcome "running" or "gone".
func (c *Client) PermitResolve(ctx context.Context, id, outcome, evidence string, override bool) (*Resolution, error) {
	var r Resolution
	p := map[string]interface{}{"id": id, "outcome": outcome, "evidence": evidence}
	if override {
		p["override"] = true
	}
	return &r, c.call(ctx, "permit.resolve", p, &r)
}

// Permit is PERMIT of PROTOCOL.md.
type Permit struct {
	ID              string        `msgpack:"id"`
	Token           int64         `msgpack:"token"`
	State           string        `msgpack:"state"`
	Phase           string        `msgpack:"phase"`
	OwnerSession    *int64        `msgpack:"owner_session"`
	OwnerReplica    *string       `msgpack:"owner_replica"`
	OwnerLive       bool          `msgpack:"owner_live"`
	OnOwnerLoss     string        `msgpack:"on_owner_loss"`
	UncertainReason *string       `msgpack:"uncertain_reason"`
	Quotas          []QuotaWeight `msgpack:"quotas"`
	IntentBytes     int64         `msgpack:"intent_bytes"`
	Intent          []byte        `msgpack:"intent"`
	Redacted        bool          `msgpack:"redacted"`
	CreatedAt       int64         `msgpack:"created_at"`
	PhaseAt         int64         `msgpack:"phase_at"`
	StateAt         int64         `msgpack:"state_at"`
	ReleasedAt      *int64        `msgpack:"released_at"`
	AgeMs           int64         `msgpack:"age_ms"`
	PhaseAgeMs      int64         `msgpack:"phase_age_ms"`
	StateAgeMs      int64         `msgpack:"state_age_ms"`
}

// PermitGet reads one permit (with its intent when it is the caller's).
func (c *Client) PermitGet(ctx context.Context, id string) (*Permit, error) {
	var r struct {
		Permit Permit `msgpack:"permit"`
	}
	err := c.call(ctx, "permit.get", map[string]interface{}{"id": id}, &r)
	return &r.Permit, err
}

// PermitFilter are permit.list's filters (zero values: absent).
type PermitFilter struct {
	Quota, State, Phase string
	Owner               int64
	Limit               int
}

func (f PermitFilter) params() map[string]interface{} {
	p := map[string]interface{}{}
	if f.Quota != "" {
		p["quota"] = f.Quota
	}
	if f.State != "" {
		p["state"] = f.State
	}
	if f.Phase != "" {
		p["phase"] = f.Phase
	}
	if f.Owner != 0 {
		p["owner"] = f.Owner
	}
	if f.Limit != 0 {
		p["limit"] = f.Limit
	}
	return p
}

// PermitList lists the first page of permits, by id; truncated says more
// follow (PermitListAll reads every page, ListPage one from a cursor).
func (c *Client) PermitList(ctx context.Context, f PermitFilter) (permits []Permit, truncated bool, err error) {
	var r struct {
		Permits   []Permit `msgpack:"permits"`
		Truncated bool     `msgpack:"truncated"`
	}
	err = c.call(ctx, "permit.list", f.params(), &r)
	return r.Permits, r.Truncated, err
}

// PermitEvent is one row of permit.history.
type PermitEvent struct {
	Seq    int64   `msgpack:"seq"`
	Event  string  `msgpack:"event"`
	Quota  *string `msgpack:"quota"`
	Delta  int64   `msgpack:"delta"`
	Actor  string  `msgpack:"actor"`
	Reason *string `msgpack:"reason"`
	State  string  `msgpack:"state"`
	Phase  string  `msgpack:"phase"`
	At     int64   `msgpack:"at"`
}

// PermitHistory is a permit's audit trail, oldest first.
func (c *Client) PermitHistory(ctx context.Context, id string) ([]PermitEvent, error) {
	var r struct {
		Events []PermitEvent `msgpack:"events"`
	}
	err := c.call(ctx, "permit.history", map[string]interface{}{"id": id}, &r)
	return r.Events, err
}

// Violation is one row of permit.check's violations.
type Violation struct {
	Key           string `msgpack:"key"`
	Limit         int64  `msgpack:"limit"`
	InFlight      int64  `msgpack:"in_flight"`
	PermitWeights int64  `msgpack:"permit_weights"`
	AuditSum      int64  `msgpack:"audit_sum"`
	Problem       string `msgpack:"problem"`
}

// Check is permit.check's result.
type Check struct {
	OK         bool        `msgpack:"ok"`
	Quotas     int64       `msgpack:"quotas"`
	Violations []Violation `msgpack:"violations"`
	NowAt      int64       `msgpack:"now_at"`
}

// PermitCheck verifies conservation in one snapshot.
func (c *Client) PermitCheck(ctx context.Context) (*Check, error) {
	var r Check
	return &r, c.call(ctx, "permit.check", nil, &r)
}
