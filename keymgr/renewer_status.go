package keymgr

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/meshca/meshca/keymgr/upstream"
)

// RenewalStatus is how a Renewer fares, for readiness and messages.
type RenewalStatus struct {
	// LastSuccess is when it last renewed; zero before its first
	// renewal.
	LastSuccess time.Time
	// FailingSince is the first of the failures in a row, Failures how
	// many, LastErr the last one; zero while it works.
	FailingSince time.Time
	Failures     int
	LastErr      error
	// Retry is when it tries again after a failure.
	Retry time.Time
}

// Failing reports whether the last attempt failed.
func (s RenewalStatus) Failing() bool { return s.Failures > 0 }

// renewStatus is a Renewer's status behind a lock.
type renewStatus struct {
	mu sync.Mutex
	s  RenewalStatus
}

// Status returns how the renewer fares now.
func (r *Renewer) Status() RenewalStatus {
	r.status.mu.Lock()
	defer r.status.mu.Unlock()
	return r.status.s
}

func (st *renewStatus) waiting(now time.Time) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return now.Before(st.s.Retry)
}

func (st *renewStatus) worked(now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s = RenewalStatus{LastSuccess: now}
}

// failed records err at now, sets the time of the next attempt, and
// returns err.
func (r *Renewer) failed(now time.Time, err error) error {
	st := &r.status
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.s.Failures == 0 {
		st.s.FailingSince = now
	}
	st.s.Failures++
	st.s.LastErr = err
	st.s.Retry = now.Add(r.backoff(st.s.Failures, upstream.KindOf(err)))
	return err
}

// backoff is the wait after the n-th failure in a row, of kind: Backoff
// doubled with each failure (a refusal starts four times higher: an
// operator must act), at most MaxBackoff, and never more than a
// sixteenth of the intermediate's life, so that several attempts fit in
// what is left after the renewal point; then a jitter takes up to half
// of it off, so that replicas and retries spread.
func (r *Renewer) backoff(n int, kind upstream.Kind) time.Duration {
	base := cmpOr(r.Backoff, DefaultRenewBackoff)
	limit := max(min(cmpOr(r.MaxBackoff, DefaultMaxRenewBackoff), r.ttl()/16), base)
	if kind == upstream.KindRefused {
		n += 2
	}
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	j := rand.Float64
	if r.Jitter != nil {
		j = r.Jitter
	}
	return d - time.Duration(j()*float64(d)/2)
}
