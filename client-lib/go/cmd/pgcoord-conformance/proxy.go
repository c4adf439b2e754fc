package main

// A Unix-socket relay between a client and its agent that can lose a reply
// on the way back (the request reached the agent, the answer never reached
// the client) or cut every connection it carries.

import (
	"net"
	"os"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

type proxy struct {
	agentPath, path string
	ln              net.Listener

	mu         sync.Mutex
	dropMethod string
	conns      []net.Conn
}

func newProxy(agentPath, path string) (*proxy, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	p := &proxy{agentPath: agentPath, path: path, ln: ln}
	go p.acceptLoop()
	return p, nil
}

// dropReply makes the relay swallow the reply to the next request of
// method and cut that connection.
func (p *proxy) dropReply(method string) {
	p.mu.Lock()
	p.dropMethod = method
	p.mu.Unlock()
}

func (p *proxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	os.Remove(p.path)
}

func (p *proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		a, err := net.Dial("unix", p.agentPath)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, a)
		p.mu.Unlock()
		go p.relay(c, a)
	}
}

// relay forwards whole messages each way, unchanged, noting the msgids
// of requests whose replies are to be lost.
func (p *proxy) relay(c, a net.Conn) {
	defer c.Close()
	defer a.Close()
	var mu sync.Mutex
	doomed := map[uint64]bool{}
	go func() {
		defer c.Close()
		defer a.Close()
		dec := msgpack.NewDecoder(c)
		for {
			raw, err := dec.DecodeRaw()
			if err != nil {
				return
			}
			var m []interface{}
			if msgpack.Unmarshal(raw, &m) == nil && len(m) == 4 {
				method, _ := m[2].(string)
				p.mu.Lock()
				if p.dropMethod != "" && method == p.dropMethod {
					p.dropMethod = ""
					if id, ok := toInt(m[1]); ok {
						mu.Lock()
						doomed[uint64(id)] = true
						mu.Unlock()
					}
				}
				p.mu.Unlock()
			}
			if _, err := a.Write(raw); err != nil {
				return
			}
		}
	}()
	dec := msgpack.NewDecoder(a)
	for {
		raw, err := dec.DecodeRaw()
		if err != nil {
			return
		}
		var m []interface{}
		if msgpack.Unmarshal(raw, &m) == nil && len(m) == 4 {
			if kind, _ := toInt(m[0]); kind == 1 {
				if id, ok := toInt(m[1]); ok {
					mu.Lock()
					lost := doomed[uint64(id)]
					mu.Unlock()
					if lost {
						return // lost on the way back: the client never sees it
					}
				}
			}
		}
		if _, err := c.Write(raw); err != nil {
			return
		}
	}
}
