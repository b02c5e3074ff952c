package vault

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"slices"
	"strings"
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
// a role no answer has taught yet, read from <mount>/roles/<role> when the
// token may (the policy meshca needs to sign does not grant it), at most
// once per roleReadRetry. Without either, Vault's default is assumed, and
// Sign asks again once the answer has taught the role's.
type backdates struct {
	mu     sync.Mutex
	byRole map[string]time.Duration
	// readAt is when each role's read was last tried.
	readAt map[string]time.Time
}

// roleReadRetry is how long after a failed read of a role it is tried
// again (a transient error, a policy granted later).
const roleReadRetry = time.Minute

// roleBackdate returns role's backdate and whether it is known (read or
// learnt) rather than Vault's default, reading the role if it may.
func (s *Signer) roleBackdate(ctx context.Context, role string) (time.Duration, bool) {
	b := &s.backdates
	now := s.c.Now()
	b.mu.Lock()
	d, known := b.byRole[role]
	try := !known && (b.readAt[role].IsZero() || now.Sub(b.readAt[role]) >= roleReadRetry)
	if try {
		if b.readAt == nil {
			b.readAt = map[string]time.Time{}
		}
		b.readAt[role] = now
	}
	b.mu.Unlock()
	switch {
	case known:
		return d, true
	case !try:
		return DefaultRoleBackdate, false
	}
	d, ok := s.readRoleBackdate(ctx, role)
	if !ok {
		return DefaultRoleBackdate, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if learnt, ok := b.byRole[role]; ok { // an answer came meanwhile
		return learnt, true
	}
	b.set(role, d)
	return d, true
}

// knownBackdate returns role's backdate if it is known.
func (s *Signer) knownBackdate(role string) (time.Duration, bool) {
	s.backdates.mu.Lock()
	defer s.backdates.mu.Unlock()
	d, ok := s.backdates.byRole[role]
	return d, ok
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

// cappedTTL reports whether Vault warned that it cut the ttl asked (to
// the role's or the mount's max_ttl).
func cappedTTL(warnings []string) bool {
	return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "maxTTL") || strings.Contains(w, "max_ttl") })
}

// learn records what leaf, signed by role for ttlSent at start, says of
// role's backdate: Vault starts a leaf the role's not_before_duration
// before it ends it ttl after, on one clock, so the span less the ttl is
// the backdate, whatever the skew between the clocks. A leaf cut short (at
// its issuer's expiry, or by the role's max_ttl, of which Vault warns:
// capped) teaches nothing.
func (s *Signer) learn(role string, leaf *x509.Certificate, ttlSent time.Duration, start time.Time, issuerNotAfter time.Time, capped bool) {
	if capped || !leaf.NotAfter.Before(issuerNotAfter) {
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
