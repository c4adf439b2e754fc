package pgcoord

import "context"

// Record is RECORD of PROTOCOL.md.
type Record struct {
	Kind         string  `msgpack:"kind"`
	Key          string  `msgpack:"key"`
	State        string  `msgpack:"state"`
	Terminal     bool    `msgpack:"terminal"`
	Data         []byte  `msgpack:"data"`
	Permit       *string `msgpack:"permit"`
	OwnerSession int64   `msgpack:"owner_session"`
	OwnerReplica string  `msgpack:"owner_replica"`
	OwnerLive    bool    `msgpack:"owner_live"`
	Token        int64   `msgpack:"token"`
	CreatedAt    int64   `msgpack:"created_at"`
	UpdatedAt    int64   `msgpack:"updated_at"`
	SettledAt    *int64  `msgpack:"settled_at"`
	AdoptedFrom  *int64  `msgpack:"adopted_from"`
	AdoptedAt    *int64  `msgpack:"adopted_at"`
	Redacted     bool    `msgpack:"redacted"`
}

// RecordPut creates a record owned by the session (permit may be "").
// created is false for a same-session retry of the same put.
func (c *Client) RecordPut(ctx context.Context, kind, key, state string, data []byte, permit string) (rec *Record, created bool, err error) {
	p := map[string]interface{}{"kind": kind, "key": key, "state": state}
	if data != nil {
		p["data"] = data
	}
	if permit != "" {
		p["permit"] = permit
	}
	var r struct {
		Created bool   `msgpack:"created"`
		Record  Record `msgpack:"record"`
	}
	err = c.call(ctx, "record.put", p, &r)
	return &r.Record, r.Created, err
}

// RecordChange are record.update's changes; nil fields are kept. Token,
// when not 0, must be the record's current token (else ErrFenced).
type RecordChange struct {
	State *string
	Data  []byte
	Token int64
}

// RecordUpdate changes a record's state and/or data.
func (c *Client) RecordUpdate(ctx context.Context, kind, key string, ch RecordChange) (*Record, error) {
	p := map[string]interface{}{"kind": kind, "key": key}
	if ch.State != nil {
		p["state"] = *ch.State
	}
	if ch.Data != nil {
		p["data"] = ch.Data
	}
	if ch.Token != 0 {
		p["token"] = ch.Token
	}
	var r struct {
		Record Record `msgpack:"record"`
	}
	err := c.call(ctx, "record.update", p, &r)
	return &r.Record, err
}

// RecordSettle ends a record in state (token 0: any).
func (c *Client) RecordSettle(ctx context.Context, kind, key, state string, token int64) (*Record, error) {
	p := map[string]interface{}{"kind": kind, "key": key, "state": state}
	if token != 0 {
		p["token"] = token
	}
	var r struct {
		Record Record `msgpack:"record"`
	}
	err := c.call(ctx, "record.settle", p, &r)
	return &r.Record, err
}

// RecordGet reads one record.
func (c *Client) RecordGet(ctx context.Context, kind, key string) (*Record, error) {
	var r struct {
		Record Record `msgpack:"record"`
	}
	err := c.call(ctx, "record.get", map[string]interface{}{"kind": kind, "key": key}, &r)
	return &r.Record, err
}

// RecordFilter are record.list's filters (nil/zero: absent).
type RecordFilter struct {
	Kind      string
	Owner     int64
	LiveOwner *bool
	Terminal  *bool
	Limit     int
}

func (f RecordFilter) params() map[string]interface{} {
	p := map[string]interface{}{}
	if f.Kind != "" {
		p["kind"] = f.Kind
	}
	if f.Owner != 0 {
		p["owner"] = f.Owner
	}
	if f.LiveOwner != nil {
		p["live_owner"] = *f.LiveOwner
	}
	if f.Terminal != nil {
		p["terminal"] = *f.Terminal
	}
	if f.Limit != 0 {
		p["limit"] = f.Limit
	}
	return p
}

// RecordList lists the first page of records by kind and key; truncated
// says more follow (RecordListAll reads every page, ListPage one from a
// cursor).
func (c *Client) RecordList(ctx context.Context, f RecordFilter) (records []Record, truncated bool, err error) {
	var r struct {
		Records   []Record `msgpack:"records"`
		Truncated bool     `msgpack:"truncated"`
	}
	err = c.call(ctx, "record.list", f.params(), &r)
	return r.Records, r.Truncated, err
}

// RecoveredPermit is one row of record.recover's permits.
type RecoveredPermit struct {
	ID              string  `msgpack:"id"`
	State           string  `msgpack:"state"`
	Phase           string  `msgpack:"phase"`
	Token           int64   `msgpack:"token"`
	OwnerSession    *int64  `msgpack:"owner_session"`
	UncertainReason *string `msgpack:"uncertain_reason"`
}

// Recovery is record.recover's result. LivenessRead false: nothing was
// adopted, Reason says why; try again later.
type Recovery struct {
	LivenessRead bool              `msgpack:"liveness_read"`
	DryRun       bool              `msgpack:"dry_run"`
	Adopted      []Record          `msgpack:"adopted"`
	Permits      []RecoveredPermit `msgpack:"permits"`
	LeftAlone    *int64            `msgpack:"left_alone"`
	Remaining    *int64            `msgpack:"remaining"`
	Reason       *string           `msgpack:"reason"`
	NowAt        *int64            `msgpack:"now_at"`
}

// RecordRecover adopts dead sessions' open records (kinds nil: all).
// Records whose owner is still live are left alone and nothing retries, so
// recovering once at boot misses a predecessor that is not dead yet: watch
// the kinds (RecordWatch) and recover again on each record.orphaned, as
// examples/scheduler does.
func (c *Client) RecordRecover(ctx context.Context, kinds []string, limit int, dryRun bool) (*Recovery, error) {
	p := map[string]interface{}{}
	if kinds != nil {
		p["kinds"] = kinds
	}
	if limit != 0 {
		p["limit"] = limit
	}
	if dryRun {
		p["dry_run"] = true
	}
	var r Recovery
	return &r, c.call(ctx, "record.recover", p, &r)
}
