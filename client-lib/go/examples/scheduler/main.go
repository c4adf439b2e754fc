// scheduler is a tiny job scheduler on pgcoord: run several replicas of it
// against one fleet and they share one quota per tenant. Each job is
// claimed before dispatch (its intent committed with the permit), recorded,
// released on completion, and marked uncertain when the "connector" drops
// it. One replica at a time leads a reconciliation loop; every replica
// recovers the records dead replicas left: at boot, and each time the agent
// says a record's owner died.
//
//	scheduler [-socket PATH] run [-jobs N] [-drop P] [-tenants a,b] [-limit N] [-stay]
//	scheduler [-socket PATH] permit-cycle [-id ID] [-quota KEY] [-limit N]
//
// run dispatches its jobs (forever with -jobs 0), then (with -stay) keeps
// following the records of replicas that die until SIGTERM or SIGINT.
// permit-cycle claims and releases one id and prints the results as JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"pgcoord.dev/pgcoord"
)

func main() {
	socket := flag.String("socket", pgcoord.DefaultSocket, "the agent's socket")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: scheduler [-socket PATH] run|permit-cycle [flags]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch flag.Arg(0) {
	case "run":
		err = run(ctx, *socket, flag.Args()[1:])
	case "permit-cycle":
		err = permitCycle(ctx, *socket, flag.Args()[1:])
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

func connect(ctx context.Context, socket, name string) (*pgcoord.Client, error) {
	c, err := pgcoord.Dial(ctx, socket, &pgcoord.Options{ClientName: name})
	if err != nil {
		return nil, err
	}
	if _, err := c.SessionOpen(ctx, name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func permitCycle(ctx context.Context, socket string, args []string) error {
	fs := flag.NewFlagSet("permit-cycle", flag.ExitOnError)
	id := fs.String("id", fmt.Sprintf("permit-cycle-%d-%d", os.Getpid(), time.Now().UnixNano()), "the permit id")
	quota := fs.String("quota", "permit-cycle", "the quota to claim on")
	limit := fs.Int64("limit", 1, "the quota's limit, when it does not exist yet")
	fs.Parse(args)

	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := connect(ctx, socket, "scheduler permit-cycle")
	if err != nil {
		return err
	}
	defer c.Close()
	claim, err := c.PermitClaim(ctx, *id, []pgcoord.QuotaWeight{{Key: *quota}},
		&pgcoord.ClaimOptions{Intent: []byte(`{"job":"permit-cycle"}`), Limit: limit})
	if err != nil {
		return err
	}
	out := map[string]interface{}{"claim": map[string]interface{}{
		"status": claim.Status, "id": claim.ID, "token": claim.Token, "state": claim.State,
		"mine": claim.Mine, "owner_session": claim.OwnerSession, "quota": claim.Quota,
		"limit": claim.Limit, "in_flight": claim.InFlight, "attempts": claim.Attempts,
	}}
	if claim.Admitted() {
		rel, err := c.PermitRelease(ctx, *id, nil)
		if err != nil {
			return err
		}
		out["release"] = map[string]interface{}{"id": rel.ID, "released": rel.Released,
			"state": rel.State}
	}
	_ = c.SessionClose(ctx)
	enc := json.NewEncoder(os.Stdout)
	return enc.Encode(out)
}

func run(ctx context.Context, socket string, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	jobs := fs.Int("jobs", 10, "jobs to dispatch before exiting (0: forever)")
	drop := fs.Float64("drop", 0.1, "chance that the connector drops a job")
	tenants := fs.String("tenants", "tenant-a,tenant-b", "tenants, each with its own quota")
	limit := fs.Int64("limit", 2, "each tenant's quota limit, when it does not exist yet")
	name := fs.String("name", fmt.Sprintf("scheduler-%d", os.Getpid()), "this replica's name")
	stay := fs.Bool("stay", false, "after the jobs, keep recovering what dying replicas leave, until SIGTERM or SIGINT")
	fs.Parse(args)

	c, err := connect(ctx, socket, *name)
	if err != nil {
		return err
	}
	defer c.Close()
	orphaned := make(chan struct{}, 1)
	go watchNotifications(c, orphaned)

	// Watch before the first recovery: no owner dies unseen.
	if _, err := c.RecordWatch(ctx, "job"); err != nil {
		return err
	}
	if !recoverDead(ctx, c) { // at boot, before taking new work
		poke(orphaned)
	}
	go followTheDead(ctx, c, orphaned)
	rctx, stopReconciler := context.WithCancel(ctx)
	defer stopReconciler()
	go reconcileWhileLeader(rctx, c)

	ts := strings.Split(*tenants, ",")
	for n := 0; *jobs == 0 || n < *jobs; n++ {
		if ctx.Err() != nil {
			break
		}
		tenant := ts[n%len(ts)]
		id := fmt.Sprintf("job-%s-%d-%d", *name, time.Now().UnixNano(), n)
		if err := dispatch(ctx, c, tenant, id, *limit, *drop); err != nil {
			return err
		}
	}
	if *stay && ctx.Err() == nil {
		log.Printf("%s: jobs dispatched; following the records of dead replicas until SIGTERM", *name)
		<-ctx.Done()
	}
	return c.SessionClose(context.Background())
}

// dispatch runs one job: a permit first (the intent committed with it),
// then the record, then the work, then the release.
func dispatch(ctx context.Context, c *pgcoord.Client, tenant, id string, limit int64, drop float64) error {
	intent := []byte(fmt.Sprintf(`{"tenant":%q,"job":%q}`, tenant, id))
	for {
		claim, err := c.PermitClaim(ctx, id, []pgcoord.QuotaWeight{{Key: tenant}},
			&pgcoord.ClaimOptions{Intent: intent, Limit: &limit})
		if err != nil {
			return err
		}
		if claim.Admitted() {
			break
		}
		if claim.Retired {
			return fmt.Errorf("job %s: denied after an unseen attempt; the id was released", id)
		}
		log.Printf("job %s: tenant %s is full (%d/%d), waiting", id, tenant, claim.InFlight, claim.Limit)
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil
		}
	}
	if _, _, err := c.RecordPut(ctx, "job", id, "dispatched", intent, id); err != nil {
		return err
	}
	if _, err := c.PermitUpdate(ctx, id, "dispatched"); err != nil {
		return err
	}
	time.Sleep(time.Duration(50+rand.Intn(100)) * time.Millisecond) // the work
	if rand.Float64() < drop {
		// The connector lost the job: it may or may not run. The slot
		// keeps counting until someone resolves it with evidence.
		_, err := c.PermitMarkUncertain(ctx, id, "connector dropped before confirming")
		log.Printf("job %s: connector dropped, permit marked uncertain", id)
		return err
	}
	if _, err := c.RecordSettle(ctx, "job", id, "done", 0); err != nil {
		return err
	}
	_, err := c.PermitRelease(ctx, id, nil)
	log.Printf("job %s: done on %s", id, tenant)
	return err
}

// recoverDead adopts the open jobs of dead sessions of this uid (a replica
// that died) and settles them: without the connector's evidence this
// example says they are gone. False when it could not finish (liveness
// unreadable, or a failed call): try again later.
func recoverDead(ctx context.Context, c *pgcoord.Client) bool {
	for {
		r, err := c.RecordRecover(ctx, []string{"job"}, 0, false)
		if err != nil {
			log.Printf("recovery: %v; trying again", err)
			return false
		}
		if !r.LivenessRead {
			log.Printf("recovery: liveness unreadable (%v); trying again", deref(r.Reason))
			return false
		}
		for _, rec := range r.Adopted {
			log.Printf("recovery: adopted job %s (was session %d)", rec.Key, *rec.AdoptedFrom)
			if rec.Permit != nil {
				_, err := c.PermitResolve(ctx, *rec.Permit, "gone", "recovered from a dead replica; connector has no trace", false)
				if err != nil && !errors.Is(err, pgcoord.ErrConflict) && !errors.Is(err, pgcoord.ErrNotFound) {
					log.Printf("recovery: %v; trying again", err)
					return false
				}
			}
			if _, err := c.RecordSettle(ctx, "job", rec.Key, "abandoned", rec.Token); err != nil {
				log.Printf("recovery: %v; trying again", err)
				return false
			}
		}
		if r.Remaining == nil || *r.Remaining == 0 {
			return true
		}
	}
}

// followTheDead recovers again each time the watch says a job's owner
// died. Recovering only at boot is not enough: a predecessor that died
// just before this replica started may still be live in the database (its
// agent ends a session at its next heartbeat after the resume grace), so
// its records are left alone then, and nobody would ask again.
func followTheDead(ctx context.Context, c *pgcoord.Client, orphaned chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-orphaned:
		}
		if !recoverDead(ctx, c) && ctx.Err() == nil {
			// the database was unreachable: try again in a while
			time.AfterFunc(time.Second, func() { poke(orphaned) })
		}
	}
}

// poke asks followTheDead for one more recovery; one pending is enough.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// reconcileWhileLeader leads the reconciliation loop: only while leader
// does it look at uncertain permits and settle those this uid owns.
func reconcileWhileLeader(ctx context.Context, c *pgcoord.Client) {
	for ctx.Err() == nil {
		lead, resign, err := c.Elect(ctx, "scheduler.reconciler", &pgcoord.LeaseOptions{TTL: 3 * time.Second})
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("reconciler: campaign: %v", err)
				time.Sleep(time.Second)
			}
			continue
		}
		log.Printf("reconciler: leading")
		for lead.Err() == nil {
			permits, _, err := c.PermitList(lead, pgcoord.PermitFilter{State: "uncertain"})
			if err == nil && len(permits) > 0 {
				log.Printf("reconciler: %d uncertain permits", len(permits))
				for _, p := range permits {
					if _, err := c.PermitResolve(lead, p.ID, "gone", "reconciler: the connector reports no such job", false); err == nil {
						log.Printf("reconciler: resolved %s gone", p.ID)
					}
				}
			}
			select {
			case <-lead.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		resign()
		log.Printf("reconciler: no longer leading")
	}
}

func watchNotifications(c *pgcoord.Client, orphaned chan struct{}) {
	for n := range c.Notifications() {
		switch n.Method {
		case "session.lost":
			log.Fatalf("session lost (%v): stopping all work", n.Params["reason"])
		case "record.orphaned":
			if n.Params["kind"] == "job" {
				poke(orphaned)
			}
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
