package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

const (
	// maxFrame bounds what one message from the agent may buffer: its
	// reply budget is 4 MiB less 64 KiB; anything past this is garbage.
	maxFrame = 8 << 20
	// partialFrameTimeout: a message begun and not finished this long is
	// a broken peer, as the agent judges its own peers.
	partialFrameTimeout = 10 * time.Second
	// quietSlice: while leases are tracked, the reader looks at the
	// socket this often even when nothing comes, so the moment it last
	// saw the queue empty (what a lease message is dated by) is never
	// older than this (libpgcoord's PGCOORD_QUIET_SLICE_MS).
	quietSlice = 50 * time.Millisecond
)

// reply is what a pending call receives. stamp is the monotonic moment
// (ms) before which the reply was not yet sent.
type reply struct {
	err    error
	result msgpack.RawMessage
	stamp  int64
}

// pending is one call in flight. onReply, when set, runs on the reader
// goroutine in stream order with the notifications around the reply.
type pending struct {
	ch      chan reply
	onReply func(result msgpack.RawMessage, stamp int64)
}

// conn is one connection to the agent: a writer shared under a lock and
// one reader goroutine that matches replies and hands on notifications.
type conn struct {
	uc     *net.UnixConn
	raw    syscall.RawConn
	wmu    sync.Mutex
	mu     sync.Mutex
	calls  map[uint32]*pending
	nextID uint32
	dead   chan struct{}
	err    error

	notify func(m *message, stamp int64) // on the reader goroutine

	dlmu     sync.Mutex // tracking and the read deadline change together
	tracking bool
}

// Pauses between connects refused with EAGAIN: from 1ms doubling to
// dialBackoffMax, each drawn from its upper half so a fleet restarting
// together does not retry in step.
const dialBackoffMax = 50 * time.Millisecond

// dialUnix connects within ctx. A Unix socket whose accept queue (the
// agent's listen_backlog) is full refuses with EAGAIN, which Go does not
// wait out: a burst of connects the agent has not caught up with, retried
// until ctx ends. ENOENT, ECONNREFUSED and the like fail at once.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	pause := time.Millisecond
	for {
		nc, err := d.DialContext(ctx, "unix", path)
		if err == nil || !errors.Is(err, syscall.EAGAIN) {
			return nc, err
		}
		t := time.NewTimer(pause/2 + time.Duration(rand.Int63n(int64(pause/2)+1)))
		select {
		case <-ctx.Done():
			t.Stop()
			why := ctx.Err().Error()
			if ctx.Err() == context.DeadlineExceeded {
				why = "timed out"
			}
			return nil, fmt.Errorf("%s while the agent's accept queue stayed full (%v)", why, err)
		case <-t.C:
		}
		if pause *= 2; pause > dialBackoffMax {
			pause = dialBackoffMax
		}
	}
}

func dial(ctx context.Context, path string, notify func(*message, int64)) (*conn, error) {
	nc, err := dialUnix(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("%w: connecting to %s: %v", ErrConnection, path, err)
	}
	uc := nc.(*net.UnixConn)
	raw, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("%w: %v", ErrConnection, err)
	}
	c := &conn{uc: uc, raw: raw, calls: map[uint32]*pending{}, dead: make(chan struct{}),
		notify: notify}
	go c.readLoop()
	return c, nil
}

// fail ends the connection once: every pending call gets err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	calls := c.calls
	c.calls = map[uint32]*pending{}
	c.mu.Unlock()
	// The socket closes before anyone hears the connection is dead: a
	// reconnect's session resume must not reach the agent while this
	// connection still holds the session there.
	c.uc.Close()
	close(c.dead)
	for _, p := range calls {
		p.ch <- reply{err: err}
	}
}

// trackLeases makes the reader date messages to within a quietSlice from
// now on, and wakes it if it is in a wait without a deadline.
func (c *conn) trackLeases() {
	c.dlmu.Lock()
	defer c.dlmu.Unlock()
	if !c.tracking {
		c.tracking = true
		_ = c.uc.SetReadDeadline(time.Now())
	}
}

func (c *conn) close() { c.fail(fmt.Errorf("%w: closed by the client", ErrConnection)) }

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// call sends one request and waits for its reply or ctx. When ctx ends
// after the request was written, the error wraps errAbandoned: the call
// may still take effect.
func (c *conn) call(ctx context.Context, method string, params map[string]interface{},
	onReply func(msgpack.RawMessage, int64)) (msgpack.RawMessage, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	p := &pending{ch: make(chan reply, 1), onReply: onReply}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, 0, err
	}
	c.nextID++
	if c.nextID == 0 { // msgid 0 is the agent's "no msgid could be read"
		c.nextID = 1
	}
	id := c.nextID
	c.calls[id] = p
	c.mu.Unlock()

	frame, err := encodeRequest(id, method, params)
	if err != nil {
		c.forget(id)
		return nil, 0, err
	}
	c.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.uc.SetWriteDeadline(dl)
	} else {
		_ = c.uc.SetWriteDeadline(time.Time{})
	}
	_, err = c.uc.Write(frame)
	c.wmu.Unlock()
	if err != nil {
		// Part of the request may have left: the outcome is unknown.
		c.fail(fmt.Errorf("%w: writing %s: %v", ErrConnection, method, err))
		return nil, 0, fmt.Errorf("%w: writing %s: %v", ErrConnection, method, err)
	}
	select {
	case r := <-p.ch:
		if r.err != nil {
			var e *Error
			if errors.As(r.err, &e) {
				e.Method = method
			}
			return nil, r.stamp, r.err
		}
		return r.result, r.stamp, nil
	case <-ctx.Done():
		c.forget(id)
		return nil, 0, &abandoned{method: method, cause: ctx.Err()}
	}
}

func (c *conn) forget(id uint32) {
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
}

// readLoop reads the socket, dating what it reads: quiet is the latest
// moment the receive queue was seen empty, so a message in bytes read
// afterwards was sent after it (PROTOCOL.md "Belief").
func (c *conn) readLoop() {
	buf := make([]byte, 0, 64<<10)
	quiet := monoMillis()
	stamp := quiet
	partialSince := time.Time{}
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= maxFrame {
				c.fail(fmt.Errorf("%w: a message over %d bytes", ErrProtocol, maxFrame))
				return
			}
			nb := make([]byte, len(buf), 2*cap(buf))
			copy(nb, buf)
			buf = nb
		}
		var deadline time.Time
		if len(buf) > 0 {
			if partialSince.IsZero() {
				partialSince = time.Now()
			}
			deadline = partialSince.Add(partialFrameTimeout)
		} else {
			partialSince = time.Time{}
		}
		c.dlmu.Lock()
		if c.tracking {
			if slice := time.Now().Add(quietSlice); deadline.IsZero() || slice.Before(deadline) {
				deadline = slice
			}
		}
		_ = c.uc.SetReadDeadline(deadline)
		c.dlmu.Unlock()
		wasEmpty := len(buf) == 0
		room := buf[len(buf):cap(buf)]
		var n int
		var rerr error
		err := c.raw.Read(func(fd uintptr) bool {
			before := monoMillis()
			got, e := syscall.Read(int(fd), room)
			if e == syscall.EAGAIN {
				quiet = before // seen empty after `before`
				return false
			}
			if e == syscall.EINTR {
				return false
			}
			if got > 0 {
				if wasEmpty {
					stamp = quiet
				}
				// A short read emptied the queue, after `before`.
				if got < len(room) {
					quiet = before
				}
			}
			n, rerr = got, e
			return true
		})
		if err == nil {
			err = rerr
		}
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) &&
			(partialSince.IsZero() || time.Since(partialSince) < partialFrameTimeout) {
			continue // a quiet slice ended: look again (and date the quiet)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.fail(fmt.Errorf("%w: the agent left a message unfinished for %v",
					ErrProtocol, partialFrameTimeout))
			} else {
				c.fail(fmt.Errorf("%w: reading: %v", ErrConnection, err))
			}
			return
		}
		if n == 0 {
			c.fail(fmt.Errorf("%w: the agent closed the connection", ErrConnection))
			return
		}
		buf = buf[:len(buf)+n]
		off := 0
		for off < len(buf) {
			fl, err := frameLen(buf[off:])
			if err == errIncomplete {
				break
			}
			if err != nil {
				c.fail(fmt.Errorf("%w: %v", ErrProtocol, err))
				return
			}
			m, err := decodeMessage(buf[off : off+fl])
			if err != nil {
				c.fail(fmt.Errorf("%w: %v", ErrProtocol, err))
				return
			}
			off += fl
			if !c.deliver(m, stamp) {
				return
			}
		}
		// Keep the unfinished rest at the front. Its message is dated
		// by the stamp taken when its first bytes were read.
		rest := copy(buf, buf[off:])
		buf = buf[:rest]
	}
}

func (c *conn) deliver(m *message, stamp int64) bool {
	if m.kind == kindNotification {
		if c.notify != nil {
			c.notify(m, stamp)
		}
		return true
	}
	if m.msgid == 0 && m.err != nil {
		// The agent refused the connection or the stream (msgid 0) and
		// closes it: every call in flight learns why.
		c.fail(fmt.Errorf("%w: the agent closed the connection: %v", ErrConnection, m.err))
		return false
	}
	c.mu.Lock()
	p := c.calls[m.msgid]
	delete(c.calls, m.msgid)
	c.mu.Unlock()
	if p == nil {
		return true // a call whose context ended
	}
	if m.err != nil {
		p.ch <- reply{err: m.err, stamp: stamp}
		return true
	}
	if p.onReply != nil {
		p.onReply(m.result, stamp)
	}
	p.ch <- reply{result: m.result, stamp: stamp}
	return true
}
