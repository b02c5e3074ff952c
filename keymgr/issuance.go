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
	writing map[string]chan struct{} // likewise: closed when its write ends
}

// errRecorded: the stored state already covers the leaf.
var errRecorded = errors.New("keymgr: issuance already recorded")

// Record makes sure the state covers leaf, issued by issuer. Concurrent
// records for one issuer share a write: while one is in progress the
// others wait for it (or for ctx) and are then usually covered by the
// horizon it recorded, so a burst of leaves costs the store one write
// rather than one read-and-compare-and-swap each.
func (l *IssuanceLog) Record(ctx context.Context, issuer, leaf *x509.Certificate) error {
	key, ttl := Fingerprint(issuer), leaf.NotAfter.Sub(leaf.NotBefore)
	for {
		l.mu.Lock()
		if !leaf.NotAfter.After(l.horizon[key]) && ttl <= l.longest[key] {
			l.mu.Unlock()
			return nil
		}
		wait, busy := l.writing[key]
		if !busy {
			if l.writing == nil {
				l.writing = map[string]chan struct{}{}
			}
			done := make(chan struct{})
			l.writing[key] = done
			l.mu.Unlock()
			err := l.write(ctx, key, issuer, leaf, ttl)
			l.mu.Lock()
			delete(l.writing, key)
			close(done)
			l.mu.Unlock()
			return err
		}
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("keymgr: waiting to record the issuance: %w", ctx.Err())
		}
	}
}

// write records leaf in the stored state and then in l's view of it.
func (l *IssuanceLog) write(ctx context.Context, key string, issuer, leaf *x509.Certificate, ttl time.Duration) error {
	ahead := l.Ahead
	if ahead <= 0 {
		ahead = DefaultIssuanceAhead
	}
	ahead = min(ahead, ttl/2) // short-lived leaves: a retire need not wait an hour
	var horizon time.Time
	var longest time.Duration
	_, err := Update(ctx, l.Store, func(s *State) error {
		rec := signedBy(s, issuer)
		switch {
		case rec == nil:
			return fmt.Errorf("keymgr: no authority of the CA state signs with %s", issuer.Subject)
		case rec.Phase == PhaseRetired:
			// This process has not followed the state yet: the leaf's root
			// is no longer in the bundle workloads trust.
			return fmt.Errorf("keymgr: authority %.16s that signed the leaf was retired at %s; this server has not followed the CA state yet",
				rec.ID(), rec.Since().Format(time.RFC3339))
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

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
