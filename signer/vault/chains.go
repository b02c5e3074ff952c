package vault

import (
	"crypto/x509"
	"sync"
	"sync/atomic"

	"github.com/meshca/meshca/internal/pemutil"
)

// maxChains bounds the CA chains a chainCache keeps.
const maxChains = 16

// chainCache keeps, by their PEM, the CA certificates Vault answers
// with, parsed: Vault sends the same issuing chain with every leaf, and
// parsing it again cost more than a tenth of the backend's share of a
// request. The certificates are shared by every answer and never changed.
type chainCache struct {
	m sync.Map // PEM string → []*x509.Certificate
	n atomic.Int32
}

// parse returns the certificates of the PEM p.
func (c *chainCache) parse(p string) ([]*x509.Certificate, error) {
	if v, ok := c.m.Load(p); ok {
		return v.([]*x509.Certificate), nil
	}
	certs, err := pemutil.ParseCertificates([]byte(p))
	if err != nil {
		return nil, err
	}
	if c.n.Add(1) <= maxChains {
		c.m.Store(p, certs)
	}
	return certs, nil
}
