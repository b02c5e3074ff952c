// Package checked is how tests get certificates from meshca: a
// caclient.Client, and caclient.Check, whose every successful reply goes
// through harness.CheckChain (zlint on the leaf, its intermediates and
// the bundle's roots; go-spiffe's X509-SVID rules on the leaf), and whose
// client also has the CA's serving certificate linted. It is apart from
// package harness because caclient registers meshca's copy of Istio's
// protos, which Istio's own client (integration/istioclient) registers
// too; harness.CheckReply serves that module.
package checked

import (
	"context"
	"crypto"
	"crypto/x509"
	"sync"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Client is a caclient.Client whose every successful reply is checked,
// and whose first successful reply also has the serving chain linted, as
// a TLS dial with the client's server name and roots sees it (gRPC does
// not show a client its connection's certificates). Tests get clients
// only from NewClient: harness's TestEveryClientIsLinted enforces it.
//
// In a benchmark (tb is a *testing.B) the replies are kept and checked at
// cleanup, outside the timed loop.
type Client struct {
	*caclient.Client
	tb  testing.TB
	cfg caclient.Config

	mu       sync.Mutex
	serving  []*x509.Certificate // the serving chain, once linted
	deferred []*caclient.SVID    // a benchmark's replies, checked at cleanup
}

// NewClient is caclient.New for tests: the same client, checked.
func NewClient(tb testing.TB, cfg caclient.Config) (*Client, error) {
	tb.Helper()
	c, err := caclient.New(cfg)
	if err != nil {
		return nil, err
	}
	lc := &Client{Client: c, tb: tb, cfg: cfg}
	if _, ok := tb.(*testing.B); ok {
		tb.Cleanup(lc.checkDeferred)
	}
	return lc, nil
}

// Check is caclient.Check followed, on success, by CheckSVID: what a test
// calls on a raw CreateCertificate reply.
func Check(tb testing.TB, chain []string, id spiffeid.ID, key crypto.Signer) (*caclient.SVID, error) {
	tb.Helper()
	svid, err := caclient.Check(chain, id, key)
	if err == nil {
		CheckSVID(tb, svid)
	}
	return svid, err
}

// CheckSVID is harness.CheckChain for what caclient returns.
func CheckSVID(tb testing.TB, svid *caclient.SVID) {
	tb.Helper()
	harness.CheckChain(tb, svid.Chain, svid.Roots, svid.Key)
}

// Fetch is caclient.Client.Fetch, checked.
func (c *Client) Fetch(ctx context.Context, id spiffeid.ID, o caclient.Options) (*caclient.SVID, error) {
	svid, err := c.Client.Fetch(ctx, id, o)
	if err == nil {
		c.check(svid)
	}
	return svid, err
}

// Call is caclient.Client.Call; a reply is checked whenever it holds a
// leaf and a bundle, whatever the caller makes of it next.
func (c *Client) Call(ctx context.Context, csrPEM string, id spiffeid.ID, o caclient.Options) ([]string, error) {
	reply, err := c.Client.Call(ctx, csrPEM, id, o)
	if err == nil {
		chain, roots, perr := harness.ParseReply(reply)
		if perr != nil {
			c.tb.Errorf("checked: %v", perr)
		} else {
			c.check(&caclient.SVID{Chain: chain, Roots: roots})
		}
	}
	return reply, err
}

func (c *Client) check(svid *caclient.SVID) {
	if _, ok := c.tb.(*testing.B); ok {
		c.mu.Lock()
		c.deferred = append(c.deferred, svid)
		c.mu.Unlock()
		return
	}
	CheckSVID(c.tb, svid)
	c.checkServing()
}

func (c *Client) checkDeferred() {
	c.mu.Lock()
	svids := c.deferred
	c.deferred = nil
	c.mu.Unlock()
	for _, s := range svids {
		CheckSVID(c.tb, s)
	}
	if len(svids) > 0 {
		c.checkServing()
	}
}

// checkServing lints the serving chain once per client; a CA that has
// gone away since the reply (a test that kills it) is tried again on the
// next reply.
func (c *Client) checkServing() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.serving != nil {
		return
	}
	chain, err := harness.ServingChain(c.cfg.Addr, c.cfg.ServerName, c.cfg.Roots)
	if err != nil {
		c.tb.Logf("checked: serving certificate of %s not linted yet: %v", c.cfg.Addr, err)
		return
	}
	c.serving = chain
	harness.CheckCertificates(c.tb, chain...)
}

// Serving returns the serving chain the client linted (nil before its
// first successful reply).
func (c *Client) Serving() []*x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.serving
}
