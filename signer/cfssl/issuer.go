package cfssl

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/meshca/meshca/signer"
)

// issuerCache holds the certificate a remote server signs with, read once.
// Concurrent callers share one fetch, which runs on its own timeout rather
// than the first caller's deadline, and each caller waits for it only as
// long as its own context allows. A failed fetch is not remembered: the
// next caller tries again.
type issuerCache struct {
	fetch   func(ctx context.Context) (*x509.Certificate, error)
	timeout time.Duration

	mu       sync.Mutex
	cert     *x509.Certificate
	inflight *issuerFetch // nil when no fetch is under way
}

type issuerFetch struct {
	done chan struct{} // closed when cert and err are set
	cert *x509.Certificate
	err  error
}

func (c *issuerCache) get(ctx context.Context) (*x509.Certificate, error) {
	c.mu.Lock()
	if c.cert != nil {
		defer c.mu.Unlock()
		return c.cert, nil
	}
	f := c.inflight
	if f == nil {
		f = &issuerFetch{done: make(chan struct{})}
		c.inflight = f
		go c.run(f)
	}
	c.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: fmt.Errorf("waiting for the server's signing certificate: %w", ctx.Err())}
	case <-f.done:
		return f.cert, f.err
	}
}

// forget drops the cached certificate if it is still stale, so that the
// next get reads the server's current one; concurrent callers that saw
// the same stale certificate cause one fetch, not one each.
func (c *issuerCache) forget(stale *x509.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && c.cert.Equal(stale) {
		c.cert = nil
	}
}

func (c *issuerCache) run(f *issuerFetch) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	f.cert, f.err = c.fetch(ctx)
	c.mu.Lock()
	if f.err == nil {
		c.cert = f.cert
	}
	c.inflight = nil
	c.mu.Unlock()
	close(f.done)
}
