package keymgr

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultIssuanceAhead is how far past a leaf's NotAfter an IssuanceLog
// pushes the recorded horizon (at most half the leaf's lifetime), so that
// a busy CA writes its state about once per this much time instead of
// once per leaf.
const DefaultIssuanceAhead = time.Hour

// IssuanceLog records in the CA state, before a leaf is handed out, how
// long leaves issued under each authority may live, which the retire
// guard relies on: no leaf outlives its authority's recorded
// LatestLeafNotAfter. It writes only when a leaf would outlive the
// recorded horizon, and then records Ahead more than needed.
type IssuanceLog struct {
	Store StateStore
	// Ahead is the horizon's headroom; DefaultIssuanceAhead when zero.
	Ahead time.Duration

	mu      sync.Mutex
	horizon map[string]time.Time     // by fingerprint of the signing certificate
	longest map[string]time.Duration // likewise
}

// errRecorded: the stored state already covers the leaf.
var errRecorded = errors.New("keymgr: issuance already recorded")

// Record makes sure the state covers leaf, issued by issuer.
func (l *IssuanceLog) Record(ctx context.Context, issuer, leaf *x509.Certificate) error {
	key, ttl := Fingerprint(issuer), leaf.NotAfter.Sub(leaf.NotBefore)
	l.mu.Lock()
	covered := !leaf.NotAfter.After(l.horizon[key]) && ttl <= l.longest[key]
	l.mu.Unlock()
	if covered {
		return nil
	}
	ahead := l.Ahead
	if ahead <= 0 {
		ahead = DefaultIssuanceAhead
	}
	ahead = min(ahead, ttl/2) // short-lived leaves: a retire need not wait an hour
	var horizon time.Time
	var longest time.Duration
	_, err := Update(ctx, l.Store, func(s *State) error {
		rec := signedBy(s, issuer)
		if rec == nil {
			return fmt.Errorf("keymgr: no authority of the CA state signs with %s", issuer.Subject)
		}
		horizon = maxTime(rec.LatestLeafNotAfter, leaf.NotAfter.Add(ahead))
		longest = max(rec.LongestLeafTTL, ttl)
		if !s.RecordIssued(rec.ID(), horizon, longest) {
			return errRecorded
		}
		return nil
	})
	if err != nil && !errors.Is(err, errRecorded) {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.horizon == nil {
		l.horizon, l.longest = map[string]time.Time{}, map[string]time.Duration{}
	}
	l.horizon[key] = maxTime(l.horizon[key], horizon)
	l.longest[key] = max(l.longest[key], longest)
	return nil
}

// signedBy is the authority whose signing certificate is issuer.
func signedBy(s *State, issuer *x509.Certificate) *AuthorityRecord {
	for _, a := range s.Authorities {
		if a.Cert.Equal(issuer) {
			return a
		}
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
