package pgcoord

import (
	"context"
	"errors"
)

// Hello is agent.hello's result.
type Hello struct {
	Agent           string `msgpack:"agent"`
	Version         string `msgpack:"version"`
	Protocol        int64  `msgpack:"protocol"`
	ReplicaID       string `msgpack:"replica_id"`
	Incarnation     int64  `msgpack:"incarnation"`
	MaxMessageBytes int64  `msgpack:"max_message_bytes"`
}

// Hello introduces the client (agent.hello).
func (c *Client) Hello(ctx context.Context) (*Hello, error) {
	var r Hello
	p := map[string]interface{}{}
	if c.opts.ClientName != "" {
		p["client"] = c.opts.ClientName
	}
	return &r, c.call(ctx, "agent.hello", p, &r)
}

// Ping checks the agent answers (agent.ping; no database).
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, "agent.ping", nil, nil)
}

// Status is agent.status's result.
type Status struct {
	ReplicaID          string `msgpack:"replica_id"`
	Incarnation        int64  `msgpack:"incarnation"`
	Host               string `msgpack:"host"`
	PID                int64  `msgpack:"pid"`
	Version            string `msgpack:"version"`
	State              string `msgpack:"state"`
	DB                 string `msgpack:"db"`
	Registered         bool   `msgpack:"registered"`
	SchemaVersion      int64  `msgpack:"schema_version"`
	SchemaRequired     int64  `msgpack:"schema_required"`
	Sessions           int64  `msgpack:"sessions"`
	Connections        int64  `msgpack:"connections"`
	LeasesHeld         int64  `msgpack:"leases_held"`
	Janitor            bool   `msgpack:"janitor"`
	UptimeMs           int64  `msgpack:"uptime_ms"`
	LastHeartbeatMsAgo int64  `msgpack:"last_heartbeat_ms_ago"`
	DBReconnects       int64  `msgpack:"db_reconnects"`
	DBQueries          int64  `msgpack:"db_queries"`
	DBFailures         int64  `msgpack:"db_failures"`
}

// Status is agent.status (no database).
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var r Status
	return &r, c.call(ctx, "agent.status", nil, &r)
}

// SessionInfo is session.open's result.
type SessionInfo struct {
	Session int64 `msgpack:"session"`
	Resumed bool  `msgpack:"resumed"`
	TTLMs   int64 `msgpack:"ttl_ms"`
	GraceMs int64 `msgpack:"grace_ms"`
	// KeepaliveMs is the keepalive the agent enforces (0: none).
	KeepaliveMs int64 `msgpack:"keepalive_ms"`
}

// sessionParams adds Options.Keepalive to session.open's params. On a
// resume it counts only for a session the agent took over from a crashed
// predecessor; a session keeps the keepalive_ms it was opened with.
func (c *Client) sessionParams(p map[string]interface{}) map[string]interface{} {
	if c.opts.Keepalive > 0 {
		p["keepalive_ms"] = c.opts.Keepalive.Milliseconds()
	}
	return p
}

// SessionOpen opens a session on this client's connection. From then on
// the client resumes it after a broken connection, within its grace.
func (c *Client) SessionOpen(ctx context.Context, name string) (*SessionInfo, error) {
	var r SessionInfo
	p := map[string]interface{}{}
	if name != "" {
		p["name"] = name
	}
	if err := c.call(ctx, "session.open", c.sessionParams(p), &r); err != nil {
		return nil, err
	}
	c.adoptSession(&r)
	return &r, nil
}

// SessionResume attaches a session opened earlier (say, by a process that
// restarted within the grace).
func (c *Client) SessionResume(ctx context.Context, id int64) (*SessionInfo, error) {
	var r SessionInfo
	if err := c.call(ctx, "session.open", c.sessionParams(map[string]interface{}{"resume": id}), &r); err != nil {
		return nil, err
	}
	c.adoptSession(&r)
	return &r, nil
}

func (c *Client) adoptSession(r *SessionInfo) {
	c.mu.Lock()
	c.session = r.Session
	c.resumed = r.Resumed
	c.grace = msDuration(r.GraceMs)
	c.mu.Unlock()
}

// Keepalive is session.keepalive's result.
type Keepalive struct {
	Session            int64 `msgpack:"session"`
	Live               bool  `msgpack:"live"`
	LastHeartbeatMsAgo int64 `msgpack:"last_heartbeat_ms_ago"`
	// KeepaliveMs is the session's keepalive_ms (0: none); the next
	// keepalive is due within NextDueMs.
	KeepaliveMs int64 `msgpack:"keepalive_ms"`
	NextDueMs   int64 `msgpack:"next_due_ms"`
}

// SessionKeepalive confirms the session is attached and live, and for a
// session opened with Options.Keepalive proves the application alive: see
// Options.Keepalive for where to call it from. ErrSessionExpired once the
// session is lost.
func (c *Client) SessionKeepalive(ctx context.Context) (*Keepalive, error) {
	var r Keepalive
	return &r, c.call(ctx, "session.keepalive", nil, &r)
}

// SessionClose closes the session at once; its beliefs end before asking.
func (c *Client) SessionClose(ctx context.Context) error {
	c.mu.Lock()
	c.endBeliefsLocked()
	c.mu.Unlock()
	err := c.call(ctx, "session.close", nil, nil)
	if err == nil || errorCode(err) == "no_session" || errorCode(err) == "session_expired" {
		c.mu.Lock()
		c.session = 0
		c.mu.Unlock()
	}
	return err
}

// AgentInfo is one row of fleet.agents.
type AgentInfo struct {
	ReplicaID   string `msgpack:"replica_id"`
	Incarnation int64  `msgpack:"incarnation"`
	Host        string `msgpack:"host"`
	PID         int64  `msgpack:"pid"`
	Version     string `msgpack:"version"`
	StartedAt   int64  `msgpack:"started_at"`
	HeartbeatAt int64  `msgpack:"heartbeat_at"`
	ExpiresAt   int64  `msgpack:"expires_at"`
	StoppedAt   *int64 `msgpack:"stopped_at"`
	Live        bool   `msgpack:"live"`
}

// FleetAgents lists every registered replica, following every page
// (ListPage reads one).
func (c *Client) FleetAgents(ctx context.Context) ([]AgentInfo, int64, error) {
	var list []AgentInfo
	nowAt, err := listAllInto(ctx, c, "fleet.agents", nil, &list)
	return list, nowAt, err
}

// SessionRow is one row of fleet.sessions.
type SessionRow struct {
	Session     int64  `msgpack:"session"`
	Name        string `msgpack:"name"`
	ReplicaID   string `msgpack:"replica_id"`
	Incarnation int64  `msgpack:"incarnation"`
	OpenedAt    int64  `msgpack:"opened_at"`
	ExpiresAt   int64  `msgpack:"expires_at"`
	OwnerUID    *int64 `msgpack:"owner_uid"`
}

// FleetSessions lists the live sessions of the fleet, following every
// page (ListPage reads one).
func (c *Client) FleetSessions(ctx context.Context) ([]SessionRow, int64, error) {
	var list []SessionRow
	nowAt, err := listAllInto(ctx, c, "fleet.sessions", nil, &list)
	return list, nowAt, err
}

// LeaseStatus is lease.status's result (and a row of lease.list).
type LeaseStatus struct {
	Name        string  `msgpack:"name"`
	Epoch       int64   `msgpack:"epoch"`
	Holder      *Holder `msgpack:"holder"`
	ExpiresInMs int64   `msgpack:"expires_in_ms"`
	TTLMs       int64   `msgpack:"ttl_ms"`
	AcquiredAt  int64   `msgpack:"acquired_at"`
	RenewedAt   int64   `msgpack:"renewed_at"`
	Leader      bool    `msgpack:"leader"`
	ValidMs     int64   `msgpack:"valid_ms"`
}

// LeaseStatus reads a lease; watch also subscribes the session to its
// lease.changed notifications.
func (c *Client) LeaseStatus(ctx context.Context, name string, watch bool) (*LeaseStatus, error) {
	var r LeaseStatus
	p := map[string]interface{}{"name": name}
	if watch {
		p["watch"] = true
	}
	return &r, c.call(ctx, "lease.status", p, &r)
}

// LeaseList lists every lease, by name, following every page (ListPage
// reads one).
func (c *Client) LeaseList(ctx context.Context) ([]LeaseStatus, error) {
	var list []LeaseStatus
	_, err := listAllInto(ctx, c, "lease.list", nil, &list)
	return list, err
}

// Quota is QUOTA of PROTOCOL.md.
type Quota struct {
	Key         string `msgpack:"key"`
	Limit       int64  `msgpack:"limit"`
	InFlight    int64  `msgpack:"in_flight"`
	Held        int64  `msgpack:"held"`
	Uncertain   int64  `msgpack:"uncertain"`
	Available   int64  `msgpack:"available"`
	Permits     int64  `msgpack:"permits"`
	LapseAfterS *int64 `msgpack:"lapse_after_s"`
	CreatedAt   int64  `msgpack:"created_at"`
	UpdatedAt   int64  `msgpack:"updated_at"`
}

// QuotaSetResult is quota.set's result.
type QuotaSetResult struct {
	Key           string `msgpack:"key"`
	Limit         int64  `msgpack:"limit"`
	InFlight      int64  `msgpack:"in_flight"`
	LapseAfterS   *int64 `msgpack:"lapse_after_s"`
	PreviousLimit *int64 `msgpack:"previous_limit"`
	Created       bool   `msgpack:"created"`
	NowAt         int64  `msgpack:"now_at"`
}

// QuotaSet sets a limit (admin). lapseAfterS nil keeps the policy.
func (c *Client) QuotaSet(ctx context.Context, key string, limit int64, lapseAfterS *int64) (*QuotaSetResult, error) {
	var r QuotaSetResult
	p := map[string]interface{}{"key": key, "limit": limit}
	if lapseAfterS != nil {
		p["lapse_after_s"] = *lapseAfterS
	}
	return &r, c.call(ctx, "quota.set", p, &r)
}

// QuotaGet reads one quota.
func (c *Client) QuotaGet(ctx context.Context, key string) (*Quota, error) {
	var r struct {
		Quota Quota `msgpack:"quota"`
	}
	err := c.call(ctx, "quota.get", map[string]interface{}{"key": key}, &r)
	return &r.Quota, err
}

// QuotaList lists every quota, by key, following every page (ListPage
// reads one).
func (c *Client) QuotaList(ctx context.Context) ([]Quota, error) {
	var list []Quota
	_, err := listAllInto(ctx, c, "quota.list", nil, &list)
	return list, err
}

func errorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
