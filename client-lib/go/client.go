// Package pgcoord is the Go client of pgcoord-agent: MessagePack-RPC over
// the agent's Unix socket, as proto/PROTOCOL.md specifies it, with the
// same rules as libpgcoord for leader belief, session resume and retries
// with the same ids.
//
// A Client is safe for use by many goroutines. Every call takes a
// context.Context; cancelling it abandons the wait for the reply (the
// call may still take effect, as any call whose reply was not seen).
//
// Lists page (PROTOCOL.md, "Paging"). LeaseList, QuotaList, FleetAgents
// and FleetSessions follow every cursor and return the whole list;
// PermitList and RecordList return their first page (up to Limit, default
// 1000), as they always did, and PermitListAll and RecordListAll every
// page. ListPage reads one page of any of the six lists from a cursor,
// ListAll every page as raw rows.
package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// DefaultSocket is where the agent listens unless configured otherwise.
const DefaultSocket = "/run/pgcoord/agent.sock"

// Options tune a Client; the zero value is usable.
type Options struct {
	// ClientName is sent in agent.hello.
	ClientName string
	// NotifyBuffer is the capacity of the Notifications channel (default
	// 256). When it is full, further notifications are dropped (and
	// counted by Dropped) rather than stalling the connection; lease
	// belief and session state are kept regardless.
	NotifyBuffer int
	// RetryBackoff is the pause between retries of claims and releases
	// (default 100ms).
	RetryBackoff time.Duration
	// ConnectTimeout bounds one connect to the agent, session resume
	// included (default 5s). A connect refused because the agent's accept
	// queue is full (EAGAIN, a burst of connects) is retried within it,
	// with a short growing backoff; a missing socket or an agent that is
	// not listening fails at once.
	ConnectTimeout time.Duration
	// Keepalive, when non-zero (100ms..10min, whole milliseconds), opens
	// sessions with keepalive_ms: the application must then call
	// SessionKeepalive at least that often, or the agent declares the
	// session lost ("keepalive missed"), lets its leases lapse and applies
	// its permits' on_owner_loss rule. Call it from the goroutine that
	// does the work it vouches for (or a loop that checks that work's
	// progress), never from a free-running ticker: a goroutine that only
	// ticks would keep a hung application's leadership alive, which is
	// what the option exists to catch. The client starts none itself.
	Keepalive time.Duration
}

// Notification is one message the agent pushed, its params decoded
// loosely (ints as int64, maps as map[string]interface{}).
type Notification struct {
	Method string
	Params map[string]interface{}
}

// Client talks to one agent. It reconnects on the next call after the
// connection broke, and resumes its session when one was open and the
// grace has not run out.
type Client struct {
	path string
	opts Options

	notes   chan Notification
	mu      sync.Mutex
	cn      *conn
	dialing chan struct{}
	dialErr error
	closed  bool
	dropped uint64

	session  int64
	resumed  bool // the session was resumed, not opened, on this connection
	grace    time.Duration
	lostAt   time.Time // when the connection holding the session broke
	sessName string

	beliefs map[string]*belief
	waiters map[string]*waiter // ClaimWait's, by permit id
}

// Dial connects to the agent's socket (DefaultSocket when path is "").
func Dial(ctx context.Context, path string, opts *Options) (*Client, error) {
	if path == "" {
		path = DefaultSocket
	}
	c := &Client{path: path, beliefs: map[string]*belief{}}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.NotifyBuffer <= 0 {
		c.opts.NotifyBuffer = 256
	}
	if c.opts.RetryBackoff <= 0 {
		c.opts.RetryBackoff = 100 * time.Millisecond
	}
	if c.opts.ConnectTimeout <= 0 {
		c.opts.ConnectTimeout = 5 * time.Second
	}
	c.notes = make(chan Notification, c.opts.NotifyBuffer)
	if _, err := c.current(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Notifications delivers what the agent pushes (lease.changed,
// session.lost, …), plus a session.lost this client makes up when a
// session could not be resumed after a reconnect. It is closed by Close.
func (c *Client) Notifications() <-chan Notification { return c.notes }

// Dropped counts notifications dropped because the channel was full.
func (c *Client) Dropped() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Close ends the connection. The session, if any, stays resumable on the
// agent for its grace (call SessionClose first to end it at once).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	cn := c.cn
	c.endBeliefsLocked()
	c.failWaitersLocked("the client was closed")
	c.mu.Unlock()
	if cn != nil {
		cn.close()
	}
	c.mu.Lock()
	close(c.notes)
	c.mu.Unlock()
	return nil
}

// Session is the id of the client's session, 0 when it has none.
func (c *Client) Session() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// SessionResumed says whether the session was resumed (by SessionResume or
// after a broken connection) rather than opened.
func (c *Client) SessionResumed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session != 0 && c.resumed
}

// current returns a live connection, dialling (and resuming the
// session) when the last one broke.
func (c *Client) current(ctx context.Context) (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.cn != nil && !c.cn.isDead() {
			cn := c.cn
			c.mu.Unlock()
			return cn, nil
		}
		ch := c.dialing
		if ch == nil {
			ch = make(chan struct{})
			c.dialing = ch
			go c.reconnect(ch)
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
		ok := c.cn != nil && !c.cn.isDead()
		err := c.dialErr
		c.mu.Unlock()
		if !ok {
			if err == nil {
				err = fmt.Errorf("%w: the new connection broke at once", ErrConnection)
			}
			return nil, err
		}
	}
}

// reconnect dials and, when a session was open, resumes it. With a
// session it keeps trying until the grace is over (the agent keeps the
// session that long); without one, one attempt answers.
func (c *Client) reconnect(done chan struct{}) {
	var cn *conn
	var err error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.ConnectTimeout)
		cn, err = dial(ctx, c.path, c.onNotify)
		if err == nil {
			err = c.resume(ctx, cn)
		}
		cancel()
		c.mu.Lock()
		retry := err != nil && errors.Is(err, ErrConnection) && c.session != 0 &&
			!c.closed && time.Since(c.lostAt) < c.grace
		c.mu.Unlock()
		if !retry {
			break
		}
		if cn != nil {
			cn.close()
		}
		time.Sleep(c.opts.RetryBackoff)
	}
	c.mu.Lock()
	if err == nil && !c.closed {
		c.cn = cn
		c.dialErr = nil
		go c.onConnLost(cn)
	} else {
		if cn != nil {
			go cn.close()
		}
		if err == nil {
			err = ErrClosed
		}
		c.dialErr = err
	}
	c.dialing = nil
	c.mu.Unlock()
	close(done)
}

// resume re-attaches the session on a fresh connection. A session the
// agent will not give back is lost: the application hears session.lost.
func (c *Client) resume(ctx context.Context, cn *conn) error {
	c.mu.Lock()
	id := c.session
	c.mu.Unlock()
	if id == 0 {
		return nil
	}
	var raw []byte
	var err error
	for {
		raw, _, err = cn.call(ctx, "session.open", c.sessionParams(map[string]interface{}{"resume": id}), nil)
		// conflict: still attached to the old connection, whose close the
		// agent has not seen yet (a client can see it first); within the
		// grace, ask again shortly, as the other clients do
		var conflict *Error
		if err != nil && errors.As(err, &conflict) && conflict.Code == "conflict" &&
			c.withinResumePatience() {
			time.Sleep(resumeRetry)
			continue
		}
		break
	}
	if err == nil {
		var r SessionInfo
		if err = msgpack.Unmarshal(raw, &r); err == nil && r.Session != id {
			err = fmt.Errorf("%w: asked to resume session %d, got %d", ErrProtocol, id, r.Session)
		}
		if err == nil {
			c.mu.Lock()
			c.resumed = true
			c.mu.Unlock()
			return nil
		}
	}
	var e *Error
	if errors.As(err, &e) && !e.Retryable {
		c.mu.Lock()
		if c.session == id {
			c.session = 0
		}
		c.mu.Unlock()
		c.push(Notification{Method: "session.lost", Params: map[string]interface{}{
			"session": id, "reason": "resume refused: " + e.Code + ": " + e.Message}})
		return nil // the connection is fine, the session is gone
	}
	if err != nil && !errors.Is(err, ErrConnection) {
		err = fmt.Errorf("%w: resuming session %d: %v", ErrConnection, id, err)
	}
	return err
}

// How long a resume answered conflict is asked again, and how often.
const (
	resumePatience = 2 * time.Second
	resumeRetry    = 20 * time.Millisecond
)

func (c *Client) withinResumePatience() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	patience := resumePatience
	if c.grace < patience {
		patience = c.grace
	}
	return !c.closed && time.Since(c.lostAt) < patience
}

// onConnLost runs when a connection dies: beliefs end (nobody could tell
// this client to stop any more) and a session is resumed at once, not at
// the next call, so the grace is not spent waiting.
func (c *Client) onConnLost(cn *conn) {
	<-cn.dead
	c.mu.Lock()
	if c.cn != cn || c.closed {
		c.mu.Unlock()
		return
	}
	c.endBeliefsLocked()
	c.failWaitersLocked("the connection broke")
	c.lostAt = time.Now()
	resume := c.session != 0 && c.dialing == nil
	if resume {
		c.dialing = make(chan struct{})
		go c.reconnect(c.dialing)
	}
	c.mu.Unlock()
}

func (c *Client) push(n Notification) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	select {
	case c.notes <- n:
	default:
		c.dropped++
	}
}

// onNotify runs on the reader goroutine, in stream order.
func (c *Client) onNotify(m *message, stamp int64) {
	var params map[string]interface{}
	if err := msgpack.Unmarshal(m.params, &params); err != nil {
		return
	}
	params = loosen(params).(map[string]interface{})
	c.noteBelief(m.method, params, stamp)
	c.noteWaiter(m.method, params)
	if m.method == "session.lost" {
		if id, ok := asInt(params["session"]); ok {
			c.mu.Lock()
			if id == c.session {
				c.session = 0
				c.failWaitersLocked("the session was lost")
			}
			c.mu.Unlock()
		}
	}
	c.push(Notification{Method: m.method, Params: params})
}

// call is the one way every method goes: the current connection, the
// request, the reply decoded into out (when not nil).
func (c *Client) call(ctx context.Context, method string, params map[string]interface{},
	out interface{}) error {
	return c.callHook(ctx, method, params, out, nil)
}

func (c *Client) callHook(ctx context.Context, method string, params map[string]interface{},
	out interface{}, onReply func(msgpack.RawMessage, int64)) error {
	cn, err := c.current(ctx)
	if err != nil {
		return err
	}
	if method == "lease.acquire" {
		// A lease message is dated by when the queue was last seen
		// empty: from now on that must be recent, also while idle.
		cn.trackLeases()
	}
	raw, _, err := cn.call(ctx, method, params, onReply)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := msgpack.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%w: the %s result: %v", ErrProtocol, method, err)
	}
	return nil
}

// Call sends any method with params and decodes its result into out (a
// pointer, or nil to drop it): for methods newer than this package.
func (c *Client) Call(ctx context.Context, method string, params map[string]interface{},
	out interface{}) error {
	return c.call(ctx, method, params, out)
}

// loosen turns the int kinds msgpack decodes into int64 and nested maps
// into map[string]interface{}, so notifications read the same way.
func loosen(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		for k, e := range x {
			x[k] = loosen(e)
		}
		return x
	case []interface{}:
		for i, e := range x {
			x[i] = loosen(e)
		}
		return x
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	return v
}

func asInt(v interface{}) (int64, bool) {
	x, ok := v.(int64)
	return x, ok
}
