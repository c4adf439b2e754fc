package pgcoord

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The paged lists (PROTOCOL.md, "Paging") and the array each answers its
// rows in.
var pagedLists = map[string]string{
	"lease.list":     "leases",
	"quota.list":     "quotas",
	"fleet.agents":   "agents",
	"fleet.sessions": "sessions",
	"permit.list":    "permits",
	"record.list":    "records",
}

// allPageSize is the page a walk of every page asks for: the cap of the
// lists that page by 100 (lease.list, quota.list, fleet.*).
const allPageSize = 1000

// Page is one page of a paged list: its rows as the agent sent them (decode
// each with msgpack.Unmarshal into the list's row type), its now_at (0 for
// lists without one) and the cursor of the next page ("" after the last).
type Page struct {
	Rows       []msgpack.RawMessage
	NowAt      int64
	NextCursor string
}

// ListPage reads one page of method, one of lease.list, quota.list,
// fleet.agents, fleet.sessions, permit.list and record.list, with params
// its filters (nil for none), limit the page size (0: the method's
// default; over its cap the agent answers invalid_params) and cursor ""
// for the first page or the NextCursor of the page before.
func (c *Client) ListPage(ctx context.Context, method string, params map[string]interface{},
	limit int, cursor string) (*Page, error) {
	items, ok := pagedLists[method]
	if !ok {
		return nil, fmt.Errorf("pgcoord: %s is not a paged list", method)
	}
	p := map[string]interface{}{}
	for k, v := range params {
		p[k] = v
	}
	if limit != 0 {
		p["limit"] = limit
	}
	if cursor != "" {
		p["cursor"] = cursor
	}
	var r map[string]msgpack.RawMessage
	if err := c.call(ctx, method, p, &r); err != nil {
		return nil, err
	}
	page := &Page{}
	if err := msgpack.Unmarshal(r[items], &page.Rows); err != nil {
		return nil, fmt.Errorf("%w: the %s result's %s: %v", ErrProtocol, method, items, err)
	}
	// a nil value decodes as an empty RawMessage
	if raw := r["now_at"]; len(raw) > 0 {
		_ = msgpack.Unmarshal(raw, &page.NowAt)
	}
	var next *string
	if raw := r["next_cursor"]; len(raw) > 0 {
		if err := msgpack.Unmarshal(raw, &next); err != nil {
			return nil, fmt.Errorf("%w: the %s result's next_cursor: %v", ErrProtocol, method, err)
		}
	}
	if next != nil {
		page.NextCursor = *next
	}
	return page, nil
}

// ListAll reads every page of method (as ListPage; pageSize 0 asks for
// pages of 1000) and answers their rows in order and the last page's
// now_at. The list may change between pages: a row whose key does not
// change comes at most once.
func (c *Client) ListAll(ctx context.Context, method string, params map[string]interface{},
	pageSize int) ([]msgpack.RawMessage, int64, error) {
	if pageSize == 0 {
		pageSize = allPageSize
	}
	var rows []msgpack.RawMessage
	cursor := ""
	for {
		page, err := c.ListPage(ctx, method, params, pageSize, cursor)
		if err != nil {
			return nil, 0, err
		}
		rows = append(rows, page.Rows...)
		if page.NextCursor == "" {
			return rows, page.NowAt, nil
		}
		cursor = page.NextCursor
	}
}

// listAllInto is ListAll decoding every row into *out (a pointer to a
// slice of the row type).
func listAllInto[T any](ctx context.Context, c *Client, method string,
	params map[string]interface{}, out *[]T) (int64, error) {
	rows, nowAt, err := c.ListAll(ctx, method, params, 0)
	if err != nil {
		return 0, err
	}
	list := make([]T, len(rows))
	for i, raw := range rows {
		if err := msgpack.Unmarshal(raw, &list[i]); err != nil {
			return 0, fmt.Errorf("%w: a row of %s: %v", ErrProtocol, method, err)
		}
	}
	*out = list
	return nowAt, nil
}

// PermitListAll is PermitList over every page (f.Limit is the page size).
func (c *Client) PermitListAll(ctx context.Context, f PermitFilter) ([]Permit, error) {
	var list []Permit
	p := f.params()
	delete(p, "limit")
	rows, _, err := c.ListAll(ctx, "permit.list", p, f.Limit)
	if err != nil {
		return nil, err
	}
	for _, raw := range rows {
		var x Permit
		if err := msgpack.Unmarshal(raw, &x); err != nil {
			return nil, fmt.Errorf("%w: a row of permit.list: %v", ErrProtocol, err)
		}
		list = append(list, x)
	}
	return list, nil
}

// RecordListAll is RecordList over every page (f.Limit is the page size).
func (c *Client) RecordListAll(ctx context.Context, f RecordFilter) ([]Record, error) {
	var list []Record
	p := f.params()
	delete(p, "limit")
	rows, _, err := c.ListAll(ctx, "record.list", p, f.Limit)
	if err != nil {
		return nil, err
	}
	for _, raw := range rows {
		var x Record
		if err := msgpack.Unmarshal(raw, &x); err != nil {
			return nil, fmt.Errorf("%w: a row of record.list: %v", ErrProtocol, err)
		}
		list = append(list, x)
	}
	return list, nil
}
