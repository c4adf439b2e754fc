package main

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// listAll is the list_all op: every page of a paged list through the
// client's ListAll, its rows' `key` field compared, in order, with the
// first column of `query`.
func (r *run) listAll(s step) error {
	c, err := r.client(s)
	if err != nil {
		return err
	}
	params, _ := s["params"].(map[string]interface{})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rows, _, err := c.ListAll(ctx, str(s, "method"), params, int(num(s, "page_size", 0)))
	if err != nil {
		return fmt.Errorf("%s: %v", str(s, "method"), err)
	}
	got := []string{}
	for _, raw := range rows {
		var m map[string]interface{}
		if err := msgpack.Unmarshal(raw, &m); err != nil {
			return err
		}
		got = append(got, fmt.Sprint(normalize(m[str(s, "key")])))
	}
	want, err := psql(r.db.name, str(s, "query"))
	if err != nil {
		return err
	}
	w := []string{}
	for _, row := range want {
		w = append(w, row[0])
	}
	if len(got) != len(w) || fmt.Sprint(got) != fmt.Sprint(w) {
		return fmt.Errorf("%s: %d rows %.200v…, the database has %d: %.200v…",
			str(s, "method"), len(got), got, len(w), w)
	}
	return nil
}
