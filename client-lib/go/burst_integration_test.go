package pgcoord

// A connect refused because the agent's accept queue is full (EAGAIN: a
// burst of connects, or an agent that is not accepting for a moment) is
// retried within ConnectTimeout, then fails naming the socket and the
// cause. Real agent, as in integration_test.go.

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fillQueue connects without blocking until the (stopped) agent's accept
// queue refuses with EAGAIN; the queued sockets are closed at cleanup.
func fillQueue(t *testing.T, path string) {
	t.Helper()
	for n := 0; n < 64; n++ {
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err == syscall.EAGAIN {
			syscall.Close(fd)
			if n == 0 {
				t.Fatal("the queue was full before any connect")
			}
			return
		}
		if err != nil {
			syscall.Close(fd)
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
	}
	t.Fatal("the accept queue took 64 connects and was not full")
}

func TestIntegrationDialRetriesAFullQueue(t *testing.T) {
	a := startAgent(t, "--listen-backlog", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	a.cmd.Process.Signal(syscall.SIGSTOP)
	fillQueue(t, a.socket)
	resume := time.AfterFunc(300*time.Millisecond, func() { a.cmd.Process.Signal(syscall.SIGCONT) })
	defer resume.Stop()
	start := time.Now()
	c, err := Dial(ctx, a.socket, &Options{ConnectTimeout: 5 * time.Second})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Dial after %v: %v", took, err)
	}
	defer c.Close()
	if took < 250*time.Millisecond {
		t.Fatalf("connected after %v, while the agent was stopped", took)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping through the retried connection: %v", err)
	}

	// Left stopped past the timeout: the connect error, clearly worded.
	a.cmd.Process.Signal(syscall.SIGSTOP)
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	fillQueue(t, a.socket)
	start = time.Now()
	_, err = Dial(ctx, a.socket, &Options{ConnectTimeout: 400 * time.Millisecond})
	took = time.Since(start)
	if err == nil {
		t.Fatal("Dial succeeded while the agent was stopped with a full queue")
	}
	for _, want := range []string{a.socket, "timed out", "accept queue stayed full"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !errors.Is(err, ErrConnection) {
		t.Errorf("error %q is not ErrConnection", err)
	}
	if took < 400*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("gave up after %v of a 400ms ConnectTimeout", took)
	}

	// No socket at all: at once, not after the timeout.
	start = time.Now()
	_, err = Dial(ctx, a.socket+".missing", &Options{ConnectTimeout: 5 * time.Second})
	if err == nil || !errors.Is(err, syscall.ENOENT) && !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("Dial of a missing socket: %v", err)
	}
	if time.Since(start) > 500*time.Millisecond {
		t.Fatalf("a missing socket took %v to fail", time.Since(start))
	}
}
