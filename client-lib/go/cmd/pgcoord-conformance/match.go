package main

// The scenario file's value rules (tests/conformance/README.md,
// "Matching"): ${var} substitution and subset matching with type
// wildcards. Values are normalized first: every integer an int64.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
)

var varRe = regexp.MustCompile(`\$\{(\w+)\}`)

// substitute replaces ${name} in strings (a whole-string ${name} becomes
// the saved value itself).
func substitute(v interface{}, saved map[string]interface{}) (interface{}, error) {
	switch x := v.(type) {
	case string:
		if m := varRe.FindStringSubmatch(x); m != nil && m[0] == x {
			val, ok := saved[m[1]]
			if !ok {
				return nil, fmt.Errorf("nothing saved as %q", m[1])
			}
			return val, nil
		}
		var missing error
		out := varRe.ReplaceAllStringFunc(x, func(s string) string {
			name := varRe.FindStringSubmatch(s)[1]
			val, ok := saved[name]
			if !ok {
				missing = fmt.Errorf("nothing saved as %q", name)
			}
			return fmt.Sprint(val)
		})
		return out, missing
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			s, err := substitute(e, saved)
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	case map[string]interface{}:
		out := make(map[string]interface{}, len(x))
		for k, e := range x {
			s, err := substitute(e, saved)
			if err != nil {
				return nil, err
			}
			out[k] = s
		}
		return out, nil
	}
	return v, nil
}

// normalize turns JSON numbers and msgpack's sized ints into int64 (float64
// for non-integers), and maps with interface keys into string-keyed ones.
func normalize(v interface{}) interface{} {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]interface{}:
		out := make(map[string]interface{}, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case map[interface{}]interface{}:
		out := make(map[string]interface{}, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = normalize(e)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	if i, ok := toInt(v); ok {
		return i
	}
	return v
}

func toInt(v interface{}) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), true
	}
	return 0, false
}

// match checks that want is a subset of got.
func match(want, got interface{}, where string) error {
	switch w := want.(type) {
	case string:
		switch w {
		case "$any":
			return nil
		case "$int":
			if _, ok := got.(int64); !ok {
				return fmt.Errorf("%s: expected an integer, got %#v", where, got)
			}
			return nil
		case "$str":
			if _, ok := got.(string); !ok {
				return fmt.Errorf("%s: expected a string, got %#v", where, got)
			}
			return nil
		case "$bool":
			if _, ok := got.(bool); !ok {
				return fmt.Errorf("%s: expected a bool, got %#v", where, got)
			}
			return nil
		}
	case map[string]interface{}:
		g, ok := got.(map[string]interface{})
		if !ok {
			return fmt.Errorf("%s: expected a map, got %#v", where, got)
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k[0] == '$' {
				continue
			}
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s: no %q in %v", where, k, got)
			}
			if err := match(w[k], gv, where+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []interface{}:
		g, ok := got.([]interface{})
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: expected %v, got %#v", where, want, got)
		}
		for i := range w {
			if err := match(w[i], g[i], fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if !reflect.DeepEqual(want, got) {
		return fmt.Errorf("%s: expected %#v, got %#v", where, want, got)
	}
	return nil
}
