// Command pgcoord-conformance runs the clients' conformance scenarios
// (tests/conformance/scenarios.json, format in tests/conformance/README.md)
// with the Go client against real agents on a real database. It needs
// tests/harness/with-postgres around it and PGCOORD_TEST_AGENT_BIN.
//
//	pgcoord-conformance [-only NAME]... scenarios.json
//
// Exit status 0 when every vector and scenario passed, 1 otherwise.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	pgcoord "pgcoord.dev/pgcoord"
)

type vector struct {
	Name string `json:"name"`
	Call struct {
		Method string                 `json:"method"`
		Params map[string]interface{} `json:"params"`
	} `json:"call"`
	Result interface{} `json:"result"`
	Error  string      `json:"error"`
}

type scenario struct {
	Name   string                   `json:"name"`
	Agents []string                 `json:"agents"`
	Steps  []map[string]interface{} `json:"steps"`
}

type spec struct {
	Format    int        `json:"format"`
	Vectors   []vector   `json:"vectors"`
	Scenarios []scenario `json:"scenarios"`
}

type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

func main() {
	var only names
	flag.Var(&only, "only", "run only this scenario (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: pgcoord-conformance [-only NAME]... scenarios.json")
		os.Exit(2)
	}
	sp, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp(env("PGCOORD_TEST_TMP"), "go-conf.")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	db, err := newDatabase()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	failures := 0
	if len(only) == 0 {
		failures += runVectors(db, dir, sp.Vectors)
	}
	for _, sc := range sp.Scenarios {
		if len(only) > 0 && !contains(only, sc.Name) {
			continue
		}
		if !runScenario(db, dir, sc) {
			failures++
		}
	}
	db.close()
	if failures > 0 {
		fmt.Printf("FAILED: %d failure(s)\n", failures)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	fmt.Printf("passed: 0 failure(s)\n")
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// load reads the scenario file with every number kept exact (int64).
func load(path string) (*spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber()
	var sp spec
	if err := dec.Decode(&sp); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if sp.Format != 1 {
		return nil, fmt.Errorf("unknown scenario format %d", sp.Format)
	}
	for i := range sp.Vectors {
		v := &sp.Vectors[i]
		v.Result = normalize(v.Result)
		if v.Call.Params != nil {
			v.Call.Params = normalize(v.Call.Params).(map[string]interface{})
		}
	}
	for i := range sp.Scenarios {
		for j, st := range sp.Scenarios[i].Steps {
			sp.Scenarios[i].Steps[j] = normalize(st).(map[string]interface{})
		}
	}
	return &sp, nil
}

// runVectors sends the vectors in order on one connection to one agent.
func runVectors(db *database, dir string, vectors []vector) int {
	r, err := newRun(db, dir, []string{"v"})
	if err != nil {
		fmt.Printf("FAILED vectors: %v\n", err)
		return 1
	}
	defer r.close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	c, err := pgcoord.Dial(ctx, r.agents["v"].socket, nil)
	cancel()
	if err != nil {
		fmt.Printf("FAILED vectors: %v\n", err)
		return 1
	}
	r.clients["v"] = c
	failures := 0
	for _, v := range vectors {
		if err := runVector(c, v); err != nil {
			failures++
			fmt.Printf("FAILED vector: %s: %v\n", v.Name, err)
		} else {
			fmt.Printf("ok     vector: %s\n", v.Name)
		}
	}
	return failures
}

func runVector(c *pgcoord.Client, v vector) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var out interface{}
	err := c.Call(ctx, v.Call.Method, v.Call.Params, &out)
	s := step{}
	if v.Error != "" {
		s["error"] = v.Error
	}
	if err := expectError(s, v.Call.Method, err); err != nil || v.Error != "" {
		return err
	}
	if v.Result != nil {
		return match(v.Result, normalize(out), v.Call.Method)
	}
	return nil
}

func runScenario(db *database, dir string, sc scenario) bool {
	started := time.Now()
	r, err := newRun(db, dir, sc.Agents)
	if err != nil {
		fmt.Printf("FAILED scenario: %s: %v\n", sc.Name, err)
		return false
	}
	defer r.close()
	for i, st := range sc.Steps {
		if err := r.step(st); err != nil {
			fmt.Printf("FAILED scenario: %s: step %d (%v): %v\n", sc.Name, i+1, st["op"], err)
			for _, name := range r.agentOrder {
				a := r.agents[name]
				fmt.Printf("--- log of agent %s ---\n%s\n", a.replicaID, a.logTail())
			}
			return false
		}
	}
	fmt.Printf("ok     scenario: %s (%.1f s)\n", sc.Name, time.Since(started).Seconds())
	return true
}
