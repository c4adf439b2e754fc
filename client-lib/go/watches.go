package pgcoord

import "context"

// Watch is what quota.watch, permit.watch and record.watch answer. What
// the watch pushes (quota.changed, permit.changed, record.orphaned, each
// with "watch": ID) arrives on Notifications; the first one after the
// watch carries the current state, the others only changes.
type Watch struct {
	ID     int64 `msgpack:"watch"`
	PollMs int64 `msgpack:"poll_ms"`
}

func (c *Client) watch(ctx context.Context, method, param, target string) (*Watch, error) {
	var r Watch
	return &r, c.call(ctx, method, map[string]interface{}{param: target}, &r)
}

// QuotaWatch watches a quota's limit, in_flight, held, uncertain and room
// (needs a session; an unknown key reports exists: false).
func (c *Client) QuotaWatch(ctx context.Context, key string) (*Watch, error) {
	return c.watch(ctx, "quota.watch", "key", key)
}

// PermitWatch watches a permit's state, phase, owner and token.
func (c *Client) PermitWatch(ctx context.Context, id string) (*Watch, error) {
	return c.watch(ctx, "permit.watch", "id", id)
}

// RecordWatch watches for open records of kind whose owner session died.
func (c *Client) RecordWatch(ctx context.Context, kind string) (*Watch, error) {
	return c.watch(ctx, "record.watch", "kind", kind)
}

// WatchCancel ends one of the session's watches; false when id was not one.
func (c *Client) WatchCancel(ctx context.Context, id int64) (bool, error) {
	var r struct {
		Cancelled bool `msgpack:"cancelled"`
	}
	err := c.call(ctx, "watch.cancel", map[string]interface{}{"watch": id}, &r)
	return r.Cancelled, err
}
