package serve

import (
	"math/big"

	"github.com/meshca/meshca/keymgr"
)

// revokedSet is what one CA state revokes, indexed for the request
// path: its node blocks by node, its revocations by issuer and serial
// (and by serial alone for those of an issuer not known, which match
// any).
type revokedSet struct {
	blocked   map[string]keymgr.NodeBlock
	byIssuer  map[string]bool
	anyIssuer map[string]bool
}

func newRevokedSet(s *keymgr.State) *revokedSet {
	r := &revokedSet{blocked: make(map[string]keymgr.NodeBlock, len(s.Blocked)), byIssuer: map[string]bool{}, anyIssuer: map[string]bool{}}
	for _, b := range s.Blocked {
		r.blocked[b.Node] = b
	}
	for _, rev := range s.Revocations {
		if rev.Issuer == "" {
			r.anyIssuer[rev.Serial.Text(16)] = true
			continue
		}
		r.byIssuer[rev.Issuer+"/"+rev.Serial.Text(16)] = true
	}
	return r
}

// NodeBlocked implements ca.NodeBlocks from the CA state in service.
func (be *backend) NodeBlocked(node string) (keymgr.NodeBlock, bool) {
	r := be.revoked.Load()
	if r == nil {
		return keymgr.NodeBlock{}, false
	}
	b, ok := r.blocked[node]
	return b, ok
}

// Revoked implements ca.RevokedCerts from the CA state in service and,
// when an external backend's CRLs are published (Vault), from the serials
// they list, whatever the issuer: Vault draws its serials at random
// (159 bits).
func (be *backend) Revoked(serial *big.Int, issuer string) bool {
	if serial == nil {
		return false
	}
	s := serial.Text(16)
	if be.crlSource != nil && be.crlSource.revokedSerial(s) {
		return true
	}
	r := be.revoked.Load()
	return r != nil && (r.anyIssuer[s] || r.byIssuer[issuer+"/"+s])
}
