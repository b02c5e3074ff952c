//go:build pkcs11

package pkcs11

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThalesGroup/crypto11"
)

// poolWait bounds how long an operation waits for one of the token's
// sessions before it fails as unavailable.
const poolWait = 30 * time.Second

// A token is the logged-in connection to the token, opened on first use
// and shared by every operation: crypto11 keeps one session logged in and
// lends the others from a pool, so concurrent renewals each get their own
// session. When the token loses the login or the sessions (a re-login, a
// token removed and put back, an HSM restarted), the first operation that
// sees it closes the connection and the next one opens and logs in again.
type token struct {
	cfg Config
	// open is crypto11.Configure; tests count the logins through it.
	open func(*crypto11.Config) (*crypto11.Context, error)

	mu      sync.Mutex
	ctx     *crypto11.Context // nil until opened, and after a drop
	epoch   uint64            // counts the connections opened
	closed  bool
	opening chan struct{} // closed when an open in progress ends
	// pinErr is the login's refusal of the PIN, kept: a token locks its
	// user PIN after a few wrong ones, so a PIN it refused is never
	// tried again, however often the renewer retries.
	pinErr error
}

// conn returns the open connection and its epoch, opening one if there
// is none. It does not hold mu while the module logs in.
func (t *token) conn(ctx context.Context) (*crypto11.Context, uint64, error) {
	for {
		t.mu.Lock()
		switch {
		case t.closed:
			t.mu.Unlock()
			return nil, 0, errClosed
		case t.pinErr != nil:
			err := t.pinErr
			t.mu.Unlock()
			return nil, 0, err
		case t.ctx != nil:
			c, e := t.ctx, t.epoch
			t.mu.Unlock()
			return c, e, nil
		case t.opening != nil:
			wait := t.opening
			t.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		done := make(chan struct{})
		t.opening = done
		t.mu.Unlock()
		c, err := t.open(t.config())
		t.mu.Lock()
		t.opening = nil
		close(done)
		if err != nil {
			err = &openError{err}
			if pinError(err) {
				t.pinErr = err
			}
			t.mu.Unlock()
			return nil, 0, err
		}
		if t.closed {
			t.mu.Unlock()
			_ = c.Close()
			return nil, 0, errClosed
		}
		t.ctx = c
		t.epoch++
		e := t.epoch
		t.mu.Unlock()
		return c, e, nil
	}
}

func (t *token) config() *crypto11.Config {
	c := &crypto11.Config{
		Path:            t.cfg.Module,
		TokenLabel:      t.cfg.TokenLabel,
		SlotNumber:      t.cfg.Slot,
		Pin:             t.cfg.PIN,
		MaxSessions:     t.cfg.MaxSessions,
		PoolWaitTimeout: poolWait,
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 4
	}
	return c
}

// drop closes the connection of epoch, if it is still the open one, so
// that the next operation logs in anew. crypto11's Close waits for the
// operations in flight on it; the last connection to a module finalizes
// it, so the next open initializes the module again.
func (t *token) drop(epoch uint64) {
	t.mu.Lock()
	c := t.ctx
	if c == nil || epoch != t.epoch {
		t.mu.Unlock()
		return
	}
	t.ctx = nil
	t.mu.Unlock()
	_ = c.Close()
}

// close closes the connection; later operations fail.
func (t *token) close() error {
	t.mu.Lock()
	t.closed = true
	c := t.ctx
	t.ctx = nil
	t.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}

// do runs op on the connection. When op fails in a way a new login may
// cure (stale reports which), do drops the connection and runs op once
// more on a new one.
func (t *token) do(ctx context.Context, op func(*crypto11.Context) error) error {
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var c *crypto11.Context
		var epoch uint64
		if c, epoch, err = t.conn(ctx); err != nil {
			return err
		}
		if err = withContext(ctx, func() error { return op(c) }); err == nil || !stale(err) || ctx.Err() != nil {
			return err
		}
		t.drop(epoch)
	}
	return err
}

// withContext runs f and returns its error, or ctx's if ctx ends first:
// a PKCS#11 call cannot be interrupted, so f goes on to its end in the
// background and its result is dropped.
func withContext(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errClosed = errors.New("pkcs11: the upstream is closed")

// An openError is a failure to load the module, find the token or log
// in.
type openError struct{ err error }

func (e *openError) Error() string { return e.err.Error() }
func (e *openError) Unwrap() error { return e.err }
