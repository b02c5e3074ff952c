package vault

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"sync"
	"time"

	"github.com/meshca/meshca/signer"
)

// DefaultRoleBackdate is Vault's default not_before_duration: how far
// before now a role starts what it signs when the role does not say.
const DefaultRoleBackdate = 30 * time.Second

// maxRoleBackdate bounds what an answer can teach: a role that backdates
// by more than this is taken as having cut the leaf short instead
// (max_ttl), which says nothing of its backdate.
const maxRoleBackdate = time.Hour

// backdates is what meshca knows of each role's not_before_duration,
// which alone decides a leaf's NotBefore in Vault's PKI engine (the sign
// endpoint takes no NotBefore). A request for an exact Lifetime needs it:
// the ttl sent is the Lifetime less the role's backdate.
//
// It is learnt from every answer (its span less the ttl sent), and, for
// a role no answer has taught yet, read once from <mount>/roles/<role>
// when the token may (the policy meshca needs to sign does not grant
// it). Neither is possible before the first answer without that read:
// Vault's default is then assumed.
type backdates struct {
	mu     sync.Mutex
	byRole map[string]time.Duration
	// tried are the roles whose read was attempted.
	tried map[string]bool
}

// roleBackdate returns role's backdate, reading it from Vault once if no
// answer has taught it yet.
func (s *Signer) roleBackdate(ctx context.Context, role string) time.Duration {
	b := &s.backdates
	b.mu.Lock()
	d, known := b.byRole[role]
	tried := b.tried[role]
	if !known && !tried {
		if b.tried == nil {
			b.tried = map[string]bool{}
		}
		b.tried[role] = true
	}
	b.mu.Unlock()
	switch {
	case known:
		return d
	case tried:
		return DefaultRoleBackdate
	}
	d, ok := s.readRoleBackdate(ctx, role)
	if !ok {
		return DefaultRoleBackdate
	}
	b.mu.Lock()
	if _, learnt := b.byRole[role]; !learnt { // an answer knows better
		b.set(role, d)
	}
	b.mu.Unlock()
	return d
}

// readRoleBackdate reads role's not_before_duration; false when the
// token may not read the role or the answer does not say.
func (s *Signer) readRoleBackdate(ctx context.Context, role string) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.c.Timeout)
	defer cancel()
	r, err := s.client.Logical().ReadWithContext(ctx, s.c.Mount+"/roles/"+role)
	if err != nil || r == nil || r.Data == nil {
		return 0, false
	}
	var secs int64
	switch v := r.Data["not_before_duration"].(type) {
	case json.Number:
		if secs, err = v.Int64(); err != nil {
			return 0, false
		}
	case float64:
		secs = int64(v)
	default:
		return 0, false
	}
	d := time.Duration(secs) * time.Second
	if d < 0 || d > maxRoleBackdate {
		return 0, false
	}
	return d, true
}

// learn records what leaf, signed by role for ttlSent at start, says of
// role's backdate: Vault starts a leaf the role's not_before_duration
// before it ends it ttl after, on one clock, so the span less the ttl is
// the backdate, whatever the skew between the clocks. A leaf cut short (at
// its issuer's expiry, or by the role's max_ttl) teaches nothing.
func (s *Signer) learn(role string, leaf *x509.Certificate, ttlSent time.Duration, start time.Time, issuerNotAfter time.Time) {
	if !leaf.NotAfter.Before(issuerNotAfter) {
		return
	}
	if d := leaf.NotAfter.Sub(start.Add(ttlSent)); d < -signer.LifetimeSlack || d > signer.LifetimeSlack {
		return // not ttlSent after now: cut short, or a clock far off
	}
	d := leaf.NotAfter.Sub(leaf.NotBefore) - ttlSent
	if d < 0 || d > maxRoleBackdate {
		return
	}
	b := &s.backdates
	b.mu.Lock()
	b.set(role, d)
	b.mu.Unlock()
}

func (b *backdates) set(role string, d time.Duration) {
	if b.byRole == nil {
		b.byRole = map[string]time.Duration{}
	}
	b.byRole[role] = d
}
